#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   void *, void **, void **);
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 2000000;
  struct timespec a, b;
  for (long i = 0; i < 1000; i++) cuLaunchKernel(0,1,1,1,1,1,1,0,0,0,0);
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; i++) cuLaunchKernel(0,1,1,1,1,1,1,0,0,0,0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
  printf("launch: %ld calls of a probed empty cuLaunchKernel: %.1f ns each\n", n, ns / n);
  return 0;
}
