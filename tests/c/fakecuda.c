/* A stand-in libcuda for the uprobe tests: the probed entry points, doing nothing. */
int cuLaunchKernel(void) { __asm__ volatile("" ::: "memory"); return 0; }
int cuMemAlloc_v2(void) { __asm__ volatile("" ::: "memory"); return 0; }
