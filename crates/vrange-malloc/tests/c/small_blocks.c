/* A small program's allocations, all below the shim's threshold: blocks of 16 B to 4 KiB
 * allocated, resized, cleared and freed, some on a second thread, then its peak resident size
 * (VmHWM, KiB) printed as "hwm_kib N". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *churn(void *arg) {
  enum { N = 4096 };
  static void *slots[2][N];
  void **s = slots[arg != NULL];
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < N; i++) {
      size_t size = 16u << (i % 9);
      s[i] = (i % 3) ? malloc(size) : calloc(1, size);
      if (!s[i]) abort();
      memset(s[i], i, size);
    }
    for (int i = 0; i < N; i++) {
      void *q = realloc(s[i], 24);
      if (!q) abort();
      free(q);
    }
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, churn, (void *)1)) abort();
  churn(NULL);
  if (pthread_join(t, NULL)) abort();
  char *line = NULL;
  size_t cap = 0;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) abort();
  while (getline(&line, &cap, f) > 0)
    if (!strncmp(line, "VmHWM:", 6)) printf("hwm_kib %ld\n", strtol(line + 6, NULL, 10));
  free(line);
  fclose(f);
  return 0;
}
