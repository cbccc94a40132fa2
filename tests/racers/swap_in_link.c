/* Rename a symbolic link over every new file whose name starts with PREFIX in DIR, as soon as it appears.
 *
 * usage: swap_in_link DIR PREFIX LINK_TARGET [EVENTS]
 * EVENTS: "create" (default: right after the file is created), "close" (after it is closed once
 * written), or "both". Runs until killed; prints "swapped NAME" for each swap it made.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR PREFIX LINK_TARGET [create|close|both]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *prefix = argv[2], *target = argv[3];
    const char *which = argc > 4 ? argv[4] : "create";
    uint32_t mask = strcmp(which, "close") == 0 ? IN_CLOSE_WRITE
                  : strcmp(which, "both") == 0 ? (IN_CREATE | IN_CLOSE_WRITE) : IN_CREATE;
    int fd = inotify_init1(0);
    if (fd < 0 || inotify_add_watch(fd, dir, mask) < 0) {
        perror("inotify");
        return 1;
    }
    char tmp[PATH_MAX], dst[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.swap-in-link-%d", dir, (int)getpid());
    size_t plen = strlen(prefix);
    char buf[64 * 1024] __attribute__((aligned(8)));
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (;;) {
        unlink(tmp);
        if (symlink(target, tmp) != 0) {
            perror("symlink");
            return 1;
        }
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return 1;
        }
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            if (ev->len && strncmp(ev->name, prefix, plen) == 0) {
                snprintf(dst, sizeof dst, "%s/%s", dir, ev->name);
                if (rename(tmp, dst) == 0) {
                    printf("swapped %s\n", ev->name);
                    if (symlink(target, tmp) != 0)
                        return 1;
                }
            }
            p += sizeof(struct inotify_event) + ev->len;
        }
    }
}
