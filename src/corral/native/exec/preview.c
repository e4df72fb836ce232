/*
 * exec/preview.c: corral-exec --mount-overlay, the stage before bubblewrap
 * that mounts a preview's overlay over the workspace in a private mount
 * namespace (docs/preview.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helper.h"

/* ---------------------------------------------------------------- preview
 *
 * corral-exec --mount-overlay KIND LOWER UPPER WORK [--fuse-binary PATH]
 *             [--status-fd N] -- PROGRAM [ARG...]
 *
 * Runs before bubblewrap, as corral's direct child, never inside a sandbox:
 *
 *   1. a private mount namespace: unshare(CLONE_NEWNS) when root; otherwise
 *      unshare(CLONE_NEWUSER | CLONE_NEWNS) mapping only our own uid and gid
 *      (so files keep their owner), which grants the capabilities needed to
 *      mount in that namespace only;
 *   2. every mount private, so nothing mounted here propagates to the host;
 *   3. KIND "overlay": mount kernel overlayfs on LOWER itself (lowerdir ==
 *      mount point): the real workspace becomes the read-only lower layer
 *      and every write lands in UPPER. redirect_dir, index and metacopy are
 *      off so that UPPER holds whole files and plain whiteouts only; a user
 *      namespace mount also needs userxattr.
 *      KIND "fuse": fork fuse-overlayfs in the foreground on LOWER (it dies
 *      with us: parent-death signal) and wait until the mount appears;
 *   4. execv(PROGRAM): bubblewrap, which stays in this namespace as the
 *      sandbox's monitor and binds LOWER (now the overlay) into the sandbox.
 *
 * Unlike the main mode this writes no "R" record (the sandbox is not reached
 * yet) and leaves the status fd inheritable, so bubblewrap hands it on to the
 * helper inside. A failure is an "E" record and exit 125: nothing ran.
 *
 * SAFETY: corral's write broker opens LOWER through /proc/<our pid>/root to
 * reach the writable overlay; the sandbox sees it read-only (bubblewrap's
 * --ro-bind). The real workspace is only ever a lower layer here.
 */
void cx_write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        cx_fail("enter-user-namespace", errno, "open %s: %s", path, strerror(errno));
    size_t len = strlen(text);
    if (write(fd, text, len) != (ssize_t)len)
        cx_fail("enter-user-namespace", errno, "write %s: %s", path, strerror(errno));
    close(fd);
}

/* Append PATH to BUF with overlayfs option escaping (\, comma and colon). */
static void append_escaped(char *buf, size_t cap, size_t *len, const char *path) {
    for (const char *p = path; *p; p++) {
        if (*p == '\\' || *p == ',' || *p == ':') {
            if (*len + 1 >= cap)
                cx_fail("mount-overlay", ENAMETOOLONG, "mount options too long");
            buf[(*len)++] = '\\';
        }
        if (*len + 1 >= cap)
            cx_fail("mount-overlay", ENAMETOOLONG, "mount options too long");
        buf[(*len)++] = *p;
    }
    buf[*len] = '\0';
}

static void append_text(char *buf, size_t cap, size_t *len, const char *text) {
    size_t n = strlen(text);
    if (*len + n >= cap)
        cx_fail("mount-overlay", ENAMETOOLONG, "mount options too long");
    memcpy(buf + *len, text, n + 1);
    *len += n;
}

void cx_mount_kernel_overlay(const char *lower, const char *upper, const char *work, int in_userns) {
    static char data[3 * 4096 + 256];
    size_t len = 0;
    data[0] = '\0';
    append_text(data, sizeof data, &len, "lowerdir=");
    append_escaped(data, sizeof data, &len, lower);
    append_text(data, sizeof data, &len, ",upperdir=");
    append_escaped(data, sizeof data, &len, upper);
    append_text(data, sizeof data, &len, ",workdir=");
    append_escaped(data, sizeof data, &len, work);
    append_text(data, sizeof data, &len, in_userns ? ",userxattr" : ",redirect_dir=off,index=off,metacopy=off");
    if (mount("overlay", lower, "overlay", MS_NOSUID | MS_NODEV, data) < 0)
        cx_fail("mount-overlay", errno, "overlayfs on %s: %s", lower, strerror(errno));
}

static void mount_fuse_overlay(const char *binary, const char *lower, const char *upper, const char *work) {
    static char opts[3 * 4096 + 256];
    size_t len = 0;
    opts[0] = '\0';
    /* fuse-overlayfs has no escaping: corral refuses such paths earlier. */
    if (strpbrk(lower, ",:") || strpbrk(upper, ",:") || strpbrk(work, ",:"))
        cx_fail("mount-fuse-overlayfs", EINVAL, "paths must not contain ',' or ':'");
    append_text(opts, sizeof opts, &len, "lowerdir=");
    append_text(opts, sizeof opts, &len, lower);
    append_text(opts, sizeof opts, &len, ",upperdir=");
    append_text(opts, sizeof opts, &len, upper);
    append_text(opts, sizeof opts, &len, ",workdir=");
    append_text(opts, sizeof opts, &len, work);
    struct stat before;
    if (stat(lower, &before) < 0)
        cx_fail("mount-fuse-overlayfs", errno, "%s: %s", lower, strerror(errno));
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0)
        cx_fail("mount-fuse-overlayfs", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        /* The daemon must hold none of corral's pipes (status, output, cgroup
         * handshake) open, or corral would wait for it; and it must end with
         * us (the process that becomes bubblewrap). */
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        syscall(__NR_close_range, 3U, ~0U, 0U);
        if (prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0) < 0 || getppid() != parent)
            _exit(125);
        char *args[] = {(char *)binary, (char *)"-f", (char *)"-o", opts, (char *)lower, NULL};
        execv(binary, args);
        _exit(127);
    }
    /* Wait (at most 10 s) for the mount to appear on LOWER. */
    for (int tries = 0; tries < 10000; tries++) {
        struct stat now;
        if (stat(lower, &now) == 0 && now.st_dev != before.st_dev)
            return;
        int wstatus;
        pid_t r = waitpid(child, &wstatus, WNOHANG);
        if (r == child)
            cx_fail("mount-fuse-overlayfs", ECHILD, "fuse-overlayfs exited (status %d) before mounting %s",
                 WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus), lower);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    kill(child, SIGKILL);
    cx_fail("mount-fuse-overlayfs", ETIMEDOUT, "fuse-overlayfs did not mount %s within 10 s", lower);
}

int cx_mount_overlay_main(int argc, char **argv) {
    if (argc < 6)
        cx_usage();
    const char *kind = argv[2], *lower = argv[3], *upper = argv[4], *work = argv[5];
    const char *fuse_binary = NULL;
    int i = 6;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc)
            cx_usage();
        if (strcmp(argv[i], "--status-fd") == 0)
            cx_status_fd = (int)cx_parse_long(argv[++i], "--status-fd");
        else if (strcmp(argv[i], "--fuse-binary") == 0)
            fuse_binary = argv[++i];
        else
            cx_fail("parse-arguments", EINVAL, "unknown option %s", argv[i]);
    }
    if (i >= argc || argv[i][0] != '/')
        cx_fail("parse-arguments", EINVAL, "--mount-overlay needs an absolute program path after --");
    if (lower[0] != '/' || upper[0] != '/' || work[0] != '/')
        cx_fail("parse-arguments", EINVAL, "overlay directories must be absolute paths");
    int fuse = strcmp(kind, "fuse") == 0;
    if (!fuse && strcmp(kind, "overlay") != 0)
        cx_fail("parse-arguments", EINVAL, "unknown overlay kind %s", kind);
    if (fuse && (fuse_binary == NULL || fuse_binary[0] != '/'))
        cx_fail("parse-arguments", EINVAL, "--mount-overlay fuse needs --fuse-binary ABSOLUTE_PATH");

    /* 1. private namespaces */
    uid_t uid = geteuid();
    gid_t gid = getegid();
    int in_userns = uid != 0;
    if (unshare(CLONE_NEWNS | (in_userns ? CLONE_NEWUSER : 0)) < 0)
        cx_fail(in_userns ? "enter-user-namespace" : "enter-mount-namespace", errno, "unshare: %s",
             strerror(errno));
    if (in_userns) {
        char map[64];
        cx_write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
        cx_write_file("/proc/self/uid_map", map);
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
        cx_write_file("/proc/self/gid_map", map);
    }
    /* 2. nothing propagates back to the host */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        cx_fail("make-mounts-private", errno, "%s", strerror(errno));
    /* 3. the overlay over the workspace */
    if (fuse)
        mount_fuse_overlay(fuse_binary, lower, upper, work);
    else
        cx_mount_kernel_overlay(lower, upper, work, in_userns);
    /* 4. bubblewrap (argv[i] is absolute: no PATH lookup) */
    execv(argv[i], argv + i);
    cx_fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    return 125;
}
