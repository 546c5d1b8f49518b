/* Allocates TOTAL bytes as blocks of SIZE bytes (argv[1], argv[2]), writes every byte of every
 * block, and prints how much the process's resident memory grew, in KiB ("rss_kib N"). Run with
 * and without the vrange-malloc shim: the live footprint of the same blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rss_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    size_t size, total, n, i;
    char **blocks;
    long before, after;

    if (argc != 3)
        return 2;
    size = strtoull(argv[1], NULL, 0);
    total = strtoull(argv[2], NULL, 0);
    if (size == 0 || total < size)
        return 2;
    n = total / size;
    blocks = calloc(n, sizeof(*blocks));
    if (!blocks)
        return 3;
    before = rss_kib();
    for (i = 0; i < n; i++) {
        blocks[i] = malloc(size);
        if (!blocks[i])
            return 4;
        memset(blocks[i], (int)(i & 0x7f) + 1, size);
    }
    after = rss_kib();
    if (before < 0 || after < 0)
        return 5;
    printf("rss_kib %ld\n", after - before);
    for (i = 0; i < n; i++)
        if (blocks[i][size - 1] != (char)((i & 0x7f) + 1))
            return 6;
    return 0;
}
