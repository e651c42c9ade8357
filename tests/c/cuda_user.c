/* Uses the stand-in GPU like a direct CUDA program would: opens the device file given as
 * argv[1] and makes 3 ioctls on it, prints "ready", then on a line from stdin calls the
 * stand-in libcuda's cuLaunchKernel 7 times and cuMemAlloc_v2 twice, prints "done" and waits
 * for end of input. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

int cuLaunchKernel(void);
int cuMemAlloc_v2(void);

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0600);
    if (fd < 0) { perror("open"); return 1; }
    char arg[32] = {0};
    for (int i = 0; i < 3; i++) (void)ioctl(fd, 0xc020462aUL, arg);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < 7; i++) cuLaunchKernel();
    for (int i = 0; i < 2; i++) cuMemAlloc_v2();
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    close(fd);
    return 0;
}
