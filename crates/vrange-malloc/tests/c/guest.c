/* A program that treats its descriptors as its own, run under the shim by tests/guest.rs.
 *
 *   guest closefrom DIR   closes 3..63 the way daemons and closefrom(3) users do, opens six
 *                         files of 16 bytes in DIR, churns large blocks (the reclaimer, with a
 *                         16 MiB budget, wakes and purges), closes everything above 2 again with
 *                         close_range, opens six more, churns again, then forks: the child
 *                         churns and closes its twelve files. Every file must still hold 16
 *                         bytes and every close must succeed.
 *   guest lazyfds         one 64 KiB block held: no descriptor of vrange's may exist; once it
 *                         has been free (volatile) for a while, vrange's descriptors sit at or
 *                         above the floor given as argv[2] and are close-on-exec.
 *   guest enomem          a request larger than memory and swap together fails with ENOMEM,
 *                         through malloc, calloc, realloc and posix_memalign.
 *   guest stdswap SECS    for SECS seconds: saves stdout, closes 1, churns large blocks,
 *                         restores 1 with dup2 (as CPython's subprocess tests do around a
 *                         spawn); stdout must stay the same file every time, whatever the
 *                         reclaimer opens and closes meanwhile.
 *
 * Prints "ok" on success; anything else is a failure message. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FILES 12
static int files[FILES];
static int nfiles;

static void fail(const char *what) {
    char buf[256];
    snprintf(buf, sizeof buf, "FAIL %s (errno %d)\n", what, errno);
    /* stdout may be a file the test reads; write it directly (and to stderr where stdout is
     * closed at that moment). */
    if (write(1, buf, strlen(buf)) < 0 && write(2, buf, strlen(buf)) < 0) _exit(3);
    _exit(1);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Allocates, touches and frees blocks of 64 KiB to 4 MiB for about `ms` milliseconds, keeping
 * a few live so that free memory is volatile and over the budget. */
static void churn(long ms) {
    void *keep[8] = {0};
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0;; i++) {
        size_t len = (size_t)(64 << 10) << (i % 7);
        char *p = malloc(len);
        if (!p) fail("malloc in churn");
        memset(p, (int)i, len);
        free(keep[i % 8]);
        keep[i % 8] = p;
        if (i % 64 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms) break;
            sleep_ms(5);
        }
    }
    for (int i = 0; i < 8; i++) free(keep[i]);
}

static void open_six(const char *dir) {
    for (int i = 0; i < 6; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/file%d", dir, nfiles);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) fail("open");
        if (write(fd, "0123456789abcdef", 16) != 16) fail("write");
        files[nfiles++] = fd;
    }
}

static void check_sizes(const char *when) {
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (fstat(files[i], &st) != 0) fail(when);
        if (st.st_size != 16) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s: file%d (fd %d) holds %lld bytes, not 16", when, i,
                     files[i], (long long)st.st_size);
            errno = 0;
            fail(buf);
        }
    }
}

static int closefrom_case(const char *dir) {
    for (int fd = 3; fd < 64; fd++) close(fd);
    open_six(dir);
    churn(1500);
    check_sizes("after the first churn");
    /* Close everything above 2 once more: vrange's sources opened meanwhile go too. */
    for (int i = 0; i < nfiles; i++) files[i] = -1;
    nfiles = 0;
    if (syscall(SYS_close_range, 3u, ~0u, 0) != 0) fail("close_range");
    open_six(dir);
    churn(1500);
    /* Reopen the first six names so that all twelve are checked and closed. */
    for (int i = 0; i < 6; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/file%d", dir, i);
        int fd = open(path, O_RDWR);
        if (fd < 0) fail("reopen");
        files[nfiles++] = fd;
    }
    churn(500);
    check_sizes("after close_range and a second churn");
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        churn(300);
        check_sizes("in the fork child");
        for (int i = 0; i < nfiles; i++)
            if (close(files[i]) != 0) fail("close in the fork child");
        exit(0); /* runs the shim's exit summary */
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) fail("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = 0;
        fail("the fork child failed");
    }
    check_sizes("after the fork");
    for (int i = 0; i < nfiles; i++)
        if (close(files[i]) != 0) fail("close");
    return 0;
}

/* Descriptors open at start (inherited from whoever ran us), so that only new ones count. */
static unsigned char inherited[65536];

/* Descriptors opened since `mark_inherited` (other than the directory being listed): how many,
 * and whether all are at or above `floor` and close-on-exec (else *bad is one that is not). */
static int scan_fds(int floor, int *bad, int mark) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) fail("opendir");
    int n = 0;
    *bad = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d) || fd >= 65536) continue;
        if (mark) {
            inherited[fd] = 1;
            continue;
        }
        if (inherited[fd]) continue;
        n++;
        int flags = fcntl(fd, F_GETFD);
        if (fd < floor || flags < 0 || !(flags & FD_CLOEXEC)) *bad = fd;
    }
    closedir(d);
    return n;
}

/* Descriptors in the table of the thread named `name` (-1 if there is no such thread). */
static int thread_fds(const char *name) {
    DIR *tasks = opendir("/proc/self/task");
    if (!tasks) fail("opendir /proc/self/task");
    int n = -1;
    struct dirent *t;
    while (n < 0 && (t = readdir(tasks))) {
        if (t->d_name[0] == '.') continue;
        char path[300], comm[64] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        comm[strcspn(comm, "\n")] = 0;
        if (strcmp(comm, name)) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/fd", t->d_name);
        DIR *fds = opendir(path);
        if (!fds) fail("opendir task fd");
        n = 0;
        struct dirent *e;
        while ((e = readdir(fds)))
            if (e->d_name[0] != '.') n++;
        closedir(fds);
    }
    closedir(tasks);
    return n;
}

static int lazyfds_case(int floor) {
    int bad;
    scan_fds(floor, &bad, 1);
    char *p = malloc(64 << 10);
    if (!p) fail("malloc");
    memset(p, 1, 64 << 10);
    sleep_ms(300);
    int n = scan_fds(floor, &bad, 0);
    if (n != 0) {
        char buf[128];
        snprintf(buf, sizeof buf, "%d descriptors open while nothing is volatile", n);
        errno = 0;
        fail(buf);
    }
    free(p);
    /* The reclaimer opens its sources once volatile memory has lasted a whole tick (100 ms),
     * in a descriptor table of its own: the program's table gains nothing below the floor or
     * inheritable (where the kernel refuses the reclaimer a table of its own, its sources are
     * here, above the floor). Looked at every 50 ms for up to 20 s: a loaded machine may leave
     * the reclaimer unscheduled for seconds; every look checks the floor. */
    int own = -1;
    for (int i = 0; i < 400 && bad < 0; i++) {
        sleep_ms(50);
        n = scan_fds(floor, &bad, 0);
        own = thread_fds("vrange-reclaim");
        if (n > 0 || own > 0) break;
    }
    if (bad >= 0 || (n == 0 && own <= 0)) {
        char buf[160];
        snprintf(buf, sizeof buf,
                 "%d descriptors here and %d in the reclaimer's table with volatile memory; fd %d is "
                 "below %d or inheritable", n, own, bad, floor);
        errno = 0;
        fail(buf);
    }
    printf("descriptors %d here, %d in the reclaimer's own table\n", n, own);
    return 0;
}

static unsigned long long meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) fail("fopen /proc/meminfo");
    char line[256];
    unsigned long long v = 0;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') v = strtoull(line + k + 1, NULL, 10);
    fclose(f);
    return v;
}

static int enomem_case(void) {
    unsigned long long kb = meminfo_kb("MemTotal") + meminfo_kb("SwapTotal");
    size_t big = (size_t)(kb / 4 * 5) << 10;
    errno = 0;
    void *p = malloc(big);
    if (p || errno != ENOMEM) fail("malloc of more than memory and swap did not fail with ENOMEM");
    errno = 0;
    p = calloc(1, big);
    if (p || errno != ENOMEM) fail("calloc of more than memory and swap did not fail with ENOMEM");
    char *small = malloc(1 << 20);
    if (!small) fail("malloc");
    errno = 0;
    p = realloc(small, big);
    if (p || errno != ENOMEM) fail("realloc to more than memory and swap did not fail with ENOMEM");
    free(small);
    if (posix_memalign(&p, 1 << 21, big) != ENOMEM) fail("posix_memalign did not return ENOMEM");
    printf("requested %zu MiB\n", big >> 20);
    return 0;
}

static void stdswap_case(int secs) {
    struct stat st0, st;
    if (fstat(1, &st0) != 0) fail("fstat stdout");
    void *keep[8] = {0};
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0;; i++) {
        int saved = dup(1);
        if (saved < 0) fail("dup");
        close(1);
        for (int k = 0; k < 8; k++) {
            size_t len = (size_t)(64 << 10) << ((i + k) % 6);
            char *p = malloc(len);
            if (!p) fail("malloc in stdswap");
            memset(p, 1, len);
            free(keep[k]);
            keep[k] = p;
        }
        if (dup2(saved, 1) != 1) fail("dup2");
        close(saved);
        if (fstat(1, &st) != 0 || st.st_ino != st0.st_ino || st.st_dev != st0.st_dev) {
            char buf[96];
            snprintf(buf, sizeof buf, "FAIL stdout replaced or closed after %u swaps\n", i);
            if (write(2, buf, strlen(buf)) < 0) _exit(3);
            _exit(1);
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec >= secs) break;
    }
    for (int k = 0; k < 8; k++) free(keep[k]);
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "closefrom")) closefrom_case(argv[2]);
    else if (argc >= 3 && !strcmp(argv[1], "lazyfds")) lazyfds_case(atoi(argv[2]));
    else if (argc >= 2 && !strcmp(argv[1], "enomem")) enomem_case();
    else if (argc >= 3 && !strcmp(argv[1], "stdswap")) stdswap_case(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: guest closefrom DIR | lazyfds FLOOR | enomem | stdswap SECS\n");
        return 2;
    }
    printf("ok\n");
    return 0;
}
