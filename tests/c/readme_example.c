#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <vrange.h>

int main(void)
{
    size_t len = 16 << 20;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int purged;

    if (buf == MAP_FAILED)
        return 1;
    memset(buf, 'x', len);                                  /* costly to recompute */
    vrange((unsigned long)buf, len, VRANGE_VOLATILE, NULL); /* may be dropped under pressure */
    /* ... */
    if (vrange((unsigned long)buf, len, VRANGE_NOVOLATILE, &purged) < 0) { /* pinned again */
        perror("vrange");
        return 1;
    }
    if (purged)
        memset(buf, 'x', len);                              /* purged pages read as zero */
    printf("libvrange %u, header %s: %s\n", vrange_version(), VRANGE_VERSION_STRING,
           purged ? "regenerated" : "intact");
    return 0;
}
