/* The cost of interposition alone: malloc, free, calloc and realloc defined here, each only
 * calling glibc's own (`__libc_*`), preloaded as an allocator of its own. The mimalloc-bench
 * suite runs it beside vrange-malloc: what it costs over glibc is what any LD_PRELOAD
 * allocator that forwards the calls it does not serve pays at least (one more call through the
 * global offset table per allocation and per free). */
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);

void *malloc(size_t size) { return __libc_malloc(size); }
void free(void *ptr) { __libc_free(ptr); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *ptr, size_t size) { return __libc_realloc(ptr, size); }
