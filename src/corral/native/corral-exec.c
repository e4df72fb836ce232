/*
 * corral-exec: the last step before the sandboxed command runs.
 *
 * corral starts this helper as the first program inside the sandbox (inside
 * bubblewrap's namespaces, or directly for the process-level backends). It
 * applies the in-process restrictions that corral computed in Python, in a
 * fixed order, and then execs the command:
 *
 *   1. report "R" on the status fd (the sandbox was reached); when asked,
 *      wait for one byte on --wait-fd (corral moves us into cgroups first)
 *   2. setsid / parent-death signal / chdir            (when asked)
 *   3. resource limits (setrlimit)                      (when asked)
 *   3b. drop every capability: bounding set, ambient,
 *       effective/permitted/inheritable                 (when asked)
 *   4. PR_SET_NO_NEW_PRIVS                              (always)
 *   4b. with --reaper SIG: fork; this process stays outside the command's
 *       Landlock domain as its parent and child subreaper, and kills every
 *       process the command started when it ends (see run_as_reaper)
 *   5. Landlock ruleset                                 (when asked)
 *   6. seccomp deny filter(s)                           (when asked)
 *   7. seccomp user-notification filter, whose listener fd is sent to corral's
 *      write broker over a unix socket                  (when asked)
 *   7b. with --init (bubblewrap's --as-pid-1): fork; this process stays the
 *       sandbox's pid 1 and reaper, the child goes on (see run_as_init);
 *       with --serve FD as well, it runs no command of its own but spawns
 *       each command a resident session sends on FD (see serve_main)
 *   8. mark every fd >= 3 close-on-exec, except --keep-fd ones
 *   9. execvp(command)
 *
 * The helper holds no policy: every rule arrives as data (BPF programs,
 * Landlock rules) built and unit-tested on the Python side. Any failure is
 * written to the status fd as one line and the helper exits without running
 * the command, so corral can tell "the sandbox could not be set up" (exit
 * 125) from "the command ran and failed".
 *
 * Status fd protocol (one record per line, fd is close-on-exec):
 *   R                      reached: the helper started
 *   E<step>\t<errno>\t<text> setup failed at <step>; the command did not run
 *   X<errno>\t<program>    execvp failed (the command was not found or not
 *                          executable); the helper exits 127 or 126
 *   S<signal>              (--init, --reaper) the command was killed by <signal>
 * A successful exec closes the fd with no further record.
 *
 * A second mode, ``corral-exec --mount-overlay``, runs *before* bubblewrap for
 * ``corral preview``: it gives itself a private mount namespace (and a user
 * namespace when not root), mounts an overlay over the workspace (kernel
 * overlayfs, or a fuse-overlayfs daemon), and execs bubblewrap, which then
 * binds the overlay into the sandbox like any workspace. See
 * mount_overlay_main() below and docs/preview.md.
 *
 * SAFETY: this runs with the sandbox's credentials, after bubblewrap dropped
 * capabilities. Nothing here trusts the command; the order above matters:
 * no_new_privs must precede Landlock and seccomp (required by the kernel for
 * unprivileged callers), and the notification filter is installed last so
 * the helper's own remaining syscalls (sendmsg, close, execve) are not
 * trapped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <dirent.h>
#include <sched.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <poll.h>
#include <sys/signalfd.h>

#ifndef SECCOMP_FILTER_FLAG_NEW_LISTENER
#define SECCOMP_FILTER_FLAG_NEW_LISTENER (1UL << 3)
#endif
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif
#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#define CLOSE_RANGE_CLOEXEC_FLAG (1U << 2)

#define MAX_FILTERS 8
#define MAX_KEEP 16
#define MAX_RLIMITS 16
#define MAX_PROGRAM (64 * 1024)
#define MAX_STAGES 128
#define STAGE_DIR "/dev/shm"

static int status_fd = -1;
static int want_init = 0;       /* --init: stay pid 1, the command is our child */
static int want_ctty_global = 0; /* --ctty, for the init's child */
static int serve_fd = -1;       /* --serve: a resident session's control socket */
static int reap_signal = 0;     /* --reaper SIG: stay the command's parent; SIG kills the tree */

static void usage(void);

static void status_write(const char *buf, size_t len) {
    if (status_fd < 0)
        return;
    while (len > 0) {
        ssize_t n = write(status_fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* Report a setup failure and exit; the command never runs. */
static void fail(const char *step, int err, const char *fmt, ...) {
    char text[512];
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, "E%s\t%d\t%s\n", step, err, text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (status_fd >= 0)
        status_write(line, (size_t)n);
    else
        fprintf(stderr, "corral-exec: failed to %s: %s\n", step, text);
    _exit(125);
}

static long parse_long(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        fail("parse-arguments", EINVAL, "bad number for %s: %s", what, s);
    return v;
}

/* Read a whole fd (a BPF program or a Landlock spec) into buf. */
static size_t read_all(int fd, unsigned char *buf, size_t cap, const char *what) {
    size_t got = 0;
    for (;;) {
        if (got == cap)
            fail(what, E2BIG, "input larger than %zu bytes", cap);
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail(what, errno, "read fd %d: %s", fd, strerror(errno));
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got;
}

static int install_filter(int fd, unsigned long flags, const char *step) {
    static unsigned char buf[MAX_PROGRAM];
    size_t len = read_all(fd, buf, sizeof buf, step);
    if (len == 0 || len % sizeof(struct sock_filter) != 0)
        fail(step, EINVAL, "BPF program of %zu bytes is not a whole number of instructions", len);
    struct sock_fprog prog = {
        .len = (unsigned short)(len / sizeof(struct sock_filter)),
        .filter = (struct sock_filter *)buf,
    };
    long r = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (r < 0)
        fail(step, errno, "seccomp(SET_MODE_FILTER): %s", strerror(errno));
    return (int)r;
}

static void send_fd(int sock, int fd) {
    char byte = 'L';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    for (;;) {
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (n == 1)
            return;
        if (n < 0 && errno == EINTR)
            continue;
        fail("send-notify-listener", errno, "sendmsg: %s", strerror(errno));
    }
}

/*
 * Landlock spec (little-endian, produced by corral's Python side):
 *   u64 handled_fs, u64 handled_net, u64 scoped
 *   then records: u32 kind (1 = path beneath, 2 = net port), u32 length of
 *   the payload, u64 allowed access, payload (a NUL-terminated path, or a
 *   u64 port).
 * The Python side already masked the rights to what this kernel's ABI knows.
 */
struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};
struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));
struct ll_net_port {
    uint64_t allowed_access;
    uint64_t port;
};

static void apply_landlock(int fd) {
    static unsigned char buf[MAX_PROGRAM];
    size_t len = read_all(fd, buf, sizeof buf, "read-landlock-spec");
    if (len < 24)
        fail("apply-landlock", EINVAL, "spec too short");
    struct ll_ruleset_attr attr;
    memcpy(&attr, buf, 24);
    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, 1UL /* VERSION */);
    if (abi < 1)
        fail("apply-landlock", errno, "Landlock is not available: %s", strerror(errno));
    size_t attr_size = attr.scoped ? 24 : (attr.handled_access_net ? 16 : 8);
    long rfd = syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0UL);
    if (rfd < 0)
        fail("apply-landlock", errno, "landlock_create_ruleset: %s", strerror(errno));
    size_t off = 24;
    while (off < len) {
        if (len - off < 16)
            fail("apply-landlock", EINVAL, "truncated rule header");
        uint32_t kind, plen;
        uint64_t access;
        memcpy(&kind, buf + off, 4);
        memcpy(&plen, buf + off + 4, 4);
        memcpy(&access, buf + off + 8, 8);
        off += 16;
        if (plen > len - off)
            fail("apply-landlock", EINVAL, "truncated rule payload");
        if (kind == 1) {
            const char *path = (const char *)(buf + off);
            if (plen == 0 || path[plen - 1] != '\0')
                fail("apply-landlock", EINVAL, "path rule is not NUL-terminated");
            int pfd = open(path, O_PATH | O_CLOEXEC);
            if (pfd < 0) {
                /* A path that does not exist grants nothing; skipping it is
                 * the restrictive choice. */
                off += plen;
                continue;
            }
            struct stat st;
            if (fstat(pfd, &st) == 0 && !S_ISDIR(st.st_mode)) {
                /* Only file rights apply to non-directories:
                 * EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV. */
                access &= (1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 14) | (1ULL << 15);
            }
            struct ll_path_beneath pb = {.allowed_access = access, .parent_fd = pfd};
            if (access != 0 && syscall(__NR_landlock_add_rule, rfd, 1 /* PATH_BENEATH */, &pb, 0) < 0)
                fail("apply-landlock", errno, "landlock_add_rule %s: %s", path, strerror(errno));
            close(pfd);
        } else if (kind == 2) {
            if (plen != 8)
                fail("apply-landlock", EINVAL, "port rule payload must be 8 bytes");
            struct ll_net_port np;
            np.allowed_access = access;
            memcpy(&np.port, buf + off, 8);
            if (syscall(__NR_landlock_add_rule, rfd, 2 /* NET_PORT */, &np, 0) < 0)
                fail("apply-landlock", errno, "landlock_add_rule port %llu: %s",
                     (unsigned long long)np.port, strerror(errno));
        } else {
            fail("apply-landlock", EINVAL, "unknown rule kind %u", kind);
        }
        off += plen;
    }
    if (syscall(__NR_landlock_restrict_self, rfd, 0) < 0)
        fail("apply-landlock", errno, "landlock_restrict_self: %s", strerror(errno));
    close((int)rfd);
}

static int rlimit_resource(const char *name) {
    static const struct { const char *name; int res; } table[] = {
        {"as", RLIMIT_AS},       {"core", RLIMIT_CORE},     {"cpu", RLIMIT_CPU},
        {"data", RLIMIT_DATA},   {"fsize", RLIMIT_FSIZE},   {"nofile", RLIMIT_NOFILE},
        {"nproc", RLIMIT_NPROC}, {"stack", RLIMIT_STACK},   {"memlock", RLIMIT_MEMLOCK},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].res;
    fail("parse-arguments", EINVAL, "unknown rlimit %s", name);
    return -1;
}

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
static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail("enter-user-namespace", errno, "open %s: %s", path, strerror(errno));
    size_t len = strlen(text);
    if (write(fd, text, len) != (ssize_t)len)
        fail("enter-user-namespace", errno, "write %s: %s", path, strerror(errno));
    close(fd);
}

/* Append PATH to BUF with overlayfs option escaping (\, comma and colon). */
static void append_escaped(char *buf, size_t cap, size_t *len, const char *path) {
    for (const char *p = path; *p; p++) {
        if (*p == '\\' || *p == ',' || *p == ':') {
            if (*len + 1 >= cap)
                fail("mount-overlay", ENAMETOOLONG, "mount options too long");
            buf[(*len)++] = '\\';
        }
        if (*len + 1 >= cap)
            fail("mount-overlay", ENAMETOOLONG, "mount options too long");
        buf[(*len)++] = *p;
    }
    buf[*len] = '\0';
}

static void append_text(char *buf, size_t cap, size_t *len, const char *text) {
    size_t n = strlen(text);
    if (*len + n >= cap)
        fail("mount-overlay", ENAMETOOLONG, "mount options too long");
    memcpy(buf + *len, text, n + 1);
    *len += n;
}

static void mount_kernel_overlay(const char *lower, const char *upper, const char *work, int in_userns) {
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
        fail("mount-overlay", errno, "overlayfs on %s: %s", lower, strerror(errno));
}

static void mount_fuse_overlay(const char *binary, const char *lower, const char *upper, const char *work) {
    static char opts[3 * 4096 + 256];
    size_t len = 0;
    opts[0] = '\0';
    /* fuse-overlayfs has no escaping: corral refuses such paths earlier. */
    if (strpbrk(lower, ",:") || strpbrk(upper, ",:") || strpbrk(work, ",:"))
        fail("mount-fuse-overlayfs", EINVAL, "paths must not contain ',' or ':'");
    append_text(opts, sizeof opts, &len, "lowerdir=");
    append_text(opts, sizeof opts, &len, lower);
    append_text(opts, sizeof opts, &len, ",upperdir=");
    append_text(opts, sizeof opts, &len, upper);
    append_text(opts, sizeof opts, &len, ",workdir=");
    append_text(opts, sizeof opts, &len, work);
    struct stat before;
    if (stat(lower, &before) < 0)
        fail("mount-fuse-overlayfs", errno, "%s: %s", lower, strerror(errno));
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0)
        fail("mount-fuse-overlayfs", errno, "fork: %s", strerror(errno));
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
            fail("mount-fuse-overlayfs", ECHILD, "fuse-overlayfs exited (status %d) before mounting %s",
                 WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus), lower);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    kill(child, SIGKILL);
    fail("mount-fuse-overlayfs", ETIMEDOUT, "fuse-overlayfs did not mount %s within 10 s", lower);
}

static int mount_overlay_main(int argc, char **argv) {
    if (argc < 6)
        usage();
    const char *kind = argv[2], *lower = argv[3], *upper = argv[4], *work = argv[5];
    const char *fuse_binary = NULL;
    int i = 6;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--status-fd") == 0)
            status_fd = (int)parse_long(argv[++i], "--status-fd");
        else if (strcmp(argv[i], "--fuse-binary") == 0)
            fuse_binary = argv[++i];
        else
            fail("parse-arguments", EINVAL, "unknown option %s", argv[i]);
    }
    if (i >= argc || argv[i][0] != '/')
        fail("parse-arguments", EINVAL, "--mount-overlay needs an absolute program path after --");
    if (lower[0] != '/' || upper[0] != '/' || work[0] != '/')
        fail("parse-arguments", EINVAL, "overlay directories must be absolute paths");
    int fuse = strcmp(kind, "fuse") == 0;
    if (!fuse && strcmp(kind, "overlay") != 0)
        fail("parse-arguments", EINVAL, "unknown overlay kind %s", kind);
    if (fuse && (fuse_binary == NULL || fuse_binary[0] != '/'))
        fail("parse-arguments", EINVAL, "--mount-overlay fuse needs --fuse-binary ABSOLUTE_PATH");

    /* 1. private namespaces */
    uid_t uid = geteuid();
    gid_t gid = getegid();
    int in_userns = uid != 0;
    if (unshare(CLONE_NEWNS | (in_userns ? CLONE_NEWUSER : 0)) < 0)
        fail(in_userns ? "enter-user-namespace" : "enter-mount-namespace", errno, "unshare: %s",
             strerror(errno));
    if (in_userns) {
        char map[64];
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
        write_file("/proc/self/uid_map", map);
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
        write_file("/proc/self/gid_map", map);
    }
    /* 2. nothing propagates back to the host */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        fail("make-mounts-private", errno, "%s", strerror(errno));
    /* 3. the overlay over the workspace */
    if (fuse)
        mount_fuse_overlay(fuse_binary, lower, upper, work);
    else
        mount_kernel_overlay(lower, upper, work, in_userns);
    /* 4. bubblewrap (argv[i] is absolute: no PATH lookup) */
    execv(argv[i], argv + i);
    fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    return 125;
}

/* ------------------------------------------------------------- identity
 *
 * corral-exec --as-user UID [--idmap PATH]... [--overlay LOWER UPPER WORK]
 *             [--stage PATH]... [--keep-root] [--status-fd N] -- PROGRAM [ARG...]
 *
 * Runs before bubblewrap for a *root* caller, as corral's direct child (and
 * after --mount-overlay when both are used), never inside a sandbox:
 *
 *   1. a private mount namespace, every mount private;
 *   2. each PATH (the workspace, allowWrite directories, the session's /tmp,
 *      the caller's home) is replaced by an *idmapped* clone of itself in which
 *      the host's uid/gid 0 appear as UID: the sandbox, running as UID, owns
 *      what root owns there, and what it creates is stored as root's;
 *   2a. with --overlay (a root caller's preview), a kernel overlay is mounted
 *      on LOWER whose layers are the idmapped clones of step 2 (LOWER, UPPER
 *      and WORK must be --idmap paths or lie below one): overlayfs itself
 *      cannot be idmapped, its layers can, so the sandbox owns the merged
 *      view as it owns a plain workspace, and copy-ups land as root's;
 *   2b. the k-th --stage PATH is cloned onto STAGE_DIR/k (a private tmpfs; a
 *      clone keeps the idmapping of step 2; PATH resolved with no link
 *      followed, clone_staged): bubblewrap binds it from there,
 *      as UID may be unable to walk to PATH itself. When the kernel says UID
 *      can look PATH up (walkable_as), PATH goes back into bubblewrap's argv
 *      in place of STAGE_DIR/k (stage_word) and is bound from where it is;
 *      only with the host's root dropping to UID (not --keep-root);
 *   3. drop to UID/UID with no supplementary groups (all capabilities go with
 *      the uid change) and exec PROGRAM (bubblewrap, which then runs
 *      unprivileged and maps the sandbox's uid 0 to UID). With --keep-root,
 *      PROGRAM runs as root instead (runsc, which serves the command as UID
 *      from its own kernel and creates the command's files itself, as root:
 *      the idmapping then maps UID to 0 too, see idmap_userns).
 *
 * SAFETY: the command never holds the host's uid 0: the kernel interfaces that
 * trust the global root uid (sysctls, sysrq) and root-only host files
 * (/etc/shadow, ssh host keys) see an unprivileged user. Only the listed paths
 * are remapped, in a mount namespace nobody else uses. UID must be a uid no
 * host process or file uses (corral's Python side picks and documents it).
 */
/* A user namespace for idmapped mounts in which the host's 0 appears as UID.
 * With SWAP, UID also appears as 0: a root process creating files through the
 * clones (an overlay's mounter doing its work-directory chores, gVisor's gofer
 * before it hands a file to the command's uid) can then do so - the files are
 * stored as UID, which no host file uses, until chowned to UID (stored as 0);
 * without it, the kernel refuses (EOVERFLOW). */
static int idmap_userns(unsigned uid, int swap) {
    int go[2], ready[2];
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0)
        fail("idmap", errno, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0)
        fail("idmap", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        /* a throw-away process whose user namespace carries the mapping */
        close(go[1]);
        close(ready[0]);
        char byte = unshare(CLONE_NEWUSER) == 0 ? 'u' : 'e';
        if (write(ready[1], &byte, 1) != 1)
            _exit(1);
        while (read(go[0], &byte, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(go[0]);
    close(ready[1]);
    char byte = 0;
    ssize_t n;
    do {
        n = read(ready[0], &byte, 1);
    } while (n < 0 && errno == EINTR);
    close(ready[0]);
    if (n != 1 || byte != 'u')
        fail("idmap", EPERM, "the idmap helper could not enter a user namespace");
    char path[64], map[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("idmap", errno, "open %s: %s", path, strerror(errno));
    if (swap)
        snprintf(map, sizeof map, "0 %u 1\n%u 0 1\n", uid, uid);
    else
        snprintf(map, sizeof map, "0 %u 1\n", uid);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    write_file(path, map);
    close(go[1]);
    waitpid(child, NULL, 0);
    return fd;
}

/* Clone the mount tree at PATH onto AT (idmapped with USERNS unless it is -1). */
static void clone_tree(const char *path, const char *at, int userns) {
    int tree = (int)syscall(__NR_open_tree, AT_FDCWD, path,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        fail("idmap", errno, "open_tree %s: %s", path, strerror(errno));
    if (userns < 0)
        goto move;
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP;
    attr.userns_fd = (uint64_t)userns;
    if (syscall(__NR_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
        fail("idmap", errno,
             "idmapped mount of %s: %s (the filesystem must support idmapped mounts; "
             "--allow-degraded isolation keeps the host's root identity instead)",
             path, strerror(errno));
move:
    if (syscall(__NR_move_mount, tree, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        fail("idmap", errno, "move_mount %s: %s", at, strerror(errno));
    close(tree);
}

/* Clone the mount tree at PATH onto AT (no idmapping of its own: a clone keeps
 * the idmapping of a mapped path), PATH resolved *without following any link*.
 * Root clones what UID could not reach, so a link on the way - one another
 * user planted where she can write, or the sandbox in an earlier run - would
 * hand the sandbox whatever root can reach (what a 0700 directory guards);
 * a staged source with a link on its way fails the run instead. */
/* A detached clone of the tree at PATH (resolved with no link followed); *IS_DIR
 * says whether it is a directory. Taken before STAGE_DIR's tmpfs is mounted, so a
 * source at, under or above STAGE_DIR is cloned as the host has it. */
static int clone_staged(const char *path, int *is_dir) {
    struct open_how how;
    struct stat st;
    memset(&how, 0, sizeof how);
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(__NR_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd < 0)
        fail("stage", errno, "%s: %s (a bind source the sandbox cannot reach is staged by root "
             "and must have no symbolic link on its way)", path, strerror(errno));
    if (fstat(fd, &st) < 0)
        fail("stage", errno, "%s: %s", path, strerror(errno));
    *is_dir = S_ISDIR(st.st_mode);
    int tree = (int)syscall(__NR_open_tree, fd, "",
                            AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        fail("stage", errno, "open_tree %s: %s", path, strerror(errno));
    close(fd);
    return tree;
}

/* Whether PATH is STAGE_DIR, lies under it, or above it (but is not "/"): the
 * staging tmpfs would hide it (or a part of it) from bubblewrap, so it is always
 * staged - cloned before that tmpfs exists - never bound from where it is. */
static int near_stage_dir(const char *path) {
    size_t n = strlen(path), d = strlen(STAGE_DIR);
    if (strncmp(path, STAGE_DIR, d) == 0 && (path[d] == '\0' || path[d] == '/'))
        return 1; /* STAGE_DIR or below it */
    return n > 1 && n < d && strncmp(STAGE_DIR, path, n) == 0 && STAGE_DIR[n] == '/';
}

/* Whether PATH, its links followed, is near STAGE_DIR (see near_stage_dir), or cannot be
 * resolved: bound by its text, it would resolve in the stage's namespace into the staging
 * tmpfs - onto the clone of *another* staged source when it names STAGE_DIR/<k>. Such a
 * source is staged instead, where the link on its way fails the run (clone_staged). */
static int resolves_near_stage_dir(const char *path) {
    char *real = realpath(path, NULL);
    if (real == NULL)
        return 1;
    int near = near_stage_dir(real);
    free(real);
    return near;
}

/* Whether UID - with gid UID and no supplementary groups, as bubblewrap will run
 * - can look PATH up, asked of the kernel itself: the filesystem ids switch to
 * UID (which drops the filesystem capabilities from the effective set) for one
 * open(O_PATH) and switch back (which restores them). A caller whose ids
 * cannot switch (UID unmapped) gets 0: the path is staged. */
static int walkable_as(unsigned uid, const char *path) {
    setfsgid(uid);
    setfsuid(uid);
    int fd = -1;
    if ((unsigned)setfsuid((uid_t)-1) == uid && (unsigned)setfsgid((gid_t)-1) == uid)
        fd = open(path, O_PATH | O_CLOEXEC);
    setfsuid(0);
    setfsgid(0);
    if (setfsuid((uid_t)-1) != 0 || setfsgid((gid_t)-1) != 0)
        fail("stage", EPERM, "could not return to root's filesystem ids");
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* The index of the one bubblewrap source word STAGE_DIR/K in ARGV[FIRST..ARGC)
 * (a word right after --bind or --ro-bind, before bubblewrap's own "--"), or -1
 * when there is none or more than one: the path is staged then. */
static int stage_word(char **argv, int first, int argc, int k) {
    char want[64];
    snprintf(want, sizeof want, STAGE_DIR "/%d", k);
    int found = -1;
    for (int j = first + 1; j < argc && strcmp(argv[j], "--") != 0; j++) {
        if (strcmp(argv[j], want) != 0)
            continue;
        if (strcmp(argv[j - 1], "--bind") != 0 && strcmp(argv[j - 1], "--ro-bind") != 0)
            continue;
        if (found >= 0)
            return -1;
        found = j;
    }
    return found;
}

static int as_user_main(int argc, char **argv) {
    if (argc < 3)
        usage();
    unsigned uid = (unsigned)parse_long(argv[2], "--as-user");
    const char *paths[MAX_KEEP];
    int npaths = 0;
    const char *stages[MAX_STAGES];
    int nstages = 0;
    const char *overlay[3] = {NULL, NULL, NULL};
    int keep_root = 0;
    int i = 3;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (strcmp(argv[i], "--keep-root") == 0) {
            keep_root = 1;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--status-fd") == 0)
            status_fd = (int)parse_long(argv[++i], "--status-fd");
        else if (strcmp(argv[i], "--idmap") == 0) {
            if (npaths == MAX_KEEP)
                fail("parse-arguments", E2BIG, "too many --idmap");
            paths[npaths++] = argv[++i];
        } else if (strcmp(argv[i], "--stage") == 0) {
            if (nstages == MAX_STAGES)
                fail("parse-arguments", E2BIG, "too many --stage");
            stages[nstages++] = argv[++i];
        } else if (strcmp(argv[i], "--overlay") == 0) {
            if (i + 3 >= argc)
                usage();
            for (int k = 0; k < 3; k++) {
                overlay[k] = argv[++i];
                if (overlay[k][0] != '/')
                    fail("parse-arguments", EINVAL, "overlay directories must be absolute paths");
            }
        } else
            fail("parse-arguments", EINVAL, "unknown option %s", argv[i]);
    }
    if (i >= argc || argv[i][0] != '/')
        fail("parse-arguments", EINVAL, "--as-user needs an absolute program path after --");
    if (uid == 0)
        fail("parse-arguments", EINVAL, "--as-user needs a uid other than 0");
    if (geteuid() != 0)
        fail("as-user", EPERM, "--as-user is for a root caller");
    /* uid 0 of a user namespace (unshare --map-root-user) is not the host's
     * root: there is no identity to shed, and UID may not be mapped. Only the
     * staging is done then (bubblewrap's arguments name the staged paths). */
    int host_root = 0;
    {
        char buf[128] = {0};
        int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            unsigned a, b, c;
            host_root = n > 0 && sscanf(buf, "%u %u %u", &a, &b, &c) == 3 && a == 0 && b == 0 &&
                        c == 4294967295U;
        }
    }
    if (!host_root)
        npaths = 0;
    if (overlay[0] != NULL && npaths == 0)
        fail("as-user", EINVAL, "--overlay needs the host's root and --idmap paths for its layers");
    if (npaths > 0 || nstages > 0) {
        if (unshare(CLONE_NEWNS) < 0)
            fail("enter-mount-namespace", errno, "unshare: %s", strerror(errno));
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            fail("make-mounts-private", errno, "%s", strerror(errno));
        int userns = npaths > 0 ? idmap_userns(uid, overlay[0] != NULL || keep_root) : -1;
        for (int k = 0; k < npaths; k++) {
            if (paths[k][0] != '/')
                fail("parse-arguments", EINVAL, "--idmap needs an absolute path: %s", paths[k]);
            clone_tree(paths[k], paths[k], userns);
        }
        if (overlay[0] != NULL)
            mount_kernel_overlay(overlay[0], overlay[1], overlay[2], 0);
        /* bubblewrap, as UID, may be unable to walk to a bind source (root's
         * 0700 home, /tmp/pytest-of-root): each is cloned to STAGE_DIR/<k>, a
         * private tmpfs of this mount namespace only (the sandbox gets its own
         * /dev from bubblewrap and never sees it). A source UID can look up
         * here (asked of the kernel, after the idmapped clones above) is
         * bound by bubblewrap from where it is instead: the same mount, and
         * no tmpfs and clones for bubblewrap to copy and remount read-only. If
         * the host revokes the access in between, bubblewrap cannot bind it
         * and the run fails (nothing is left unbound). */
        int staged = 0;
        int skip[MAX_STAGES] = {0};
        if (host_root && !keep_root && nstages > 0) {
            if (setgroups(0, NULL) < 0)
                fail("as-user", errno, "drop supplementary groups: %s", strerror(errno));
            for (int k = 0; k < nstages; k++) {
                int word = stages[k][0] == '/' ? stage_word(argv, i, argc, k) : -1;
                if (word >= 0 && !near_stage_dir(stages[k]) && !resolves_near_stage_dir(stages[k]) &&
                    walkable_as(uid, stages[k])) {
                    argv[word] = (char *)stages[k];
                    skip[k] = 1;
                }
            }
        }
        /* every clone first (each keeps the idmapping of a mapped path), then the
         * tmpfs, then each clone moved onto its place in it */
        int trees[MAX_STAGES], is_dir[MAX_STAGES];
        for (int k = 0; k < nstages; k++) {
            trees[k] = -1;
            if (skip[k])
                continue;
            if (stages[k][0] != '/')
                fail("stage", EINVAL, "%s: not an absolute path", stages[k]);
            trees[k] = clone_staged(stages[k], &is_dir[k]);
            staged++;
        }
        if (staged > 0 && mount("tmpfs", STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                "mode=0755") < 0)
            fail("stage", errno, "tmpfs on %s: %s", STAGE_DIR, strerror(errno));
        for (int k = 0; k < nstages; k++) {
            char at[64];
            if (trees[k] < 0)
                continue;
            snprintf(at, sizeof at, STAGE_DIR "/%d", k);
            int made = is_dir[k] ? mkdir(at, 0755) : mknod(at, S_IFREG | 0644, 0);
            if (made < 0)
                fail("stage", errno, "%s: %s", at, strerror(errno));
            if (syscall(__NR_move_mount, trees[k], "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                fail("stage", errno, "move_mount %s: %s", at, strerror(errno));
            close(trees[k]);
        }
        if (userns >= 0)
            close(userns);
    }
    if (!host_root || keep_root) {
        execv(argv[i], argv + i);
        fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    }
    if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
        fail("as-user", errno, "switch to uid %u: %s", uid, strerror(errno));
    if (geteuid() == 0 || getegid() == 0)
        fail("as-user", EPERM, "still root after the switch to uid %u", uid);
    execv(argv[i], argv + i);
    fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    return 125;
}

/* Mark every fd >= 3 close-on-exec, then clear the flag on the kept ones. */
static void cloexec_all(const int *keep, int nkeep) {
    if (syscall(__NR_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC_FLAG) < 0) {
        DIR *d = opendir("/proc/self/fd");
        if (d == NULL)
            fail("close-inherited-fds", errno, "close_range and /proc/self/fd both unavailable");
        struct dirent *e;
        int dfd = dirfd(d);
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            int fd = atoi(e->d_name);
            if (fd >= 3 && fd != dfd)
                fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
        closedir(d);
    }
    for (int i = 0; i < nkeep; i++) {
        int flags = fcntl(keep[i], F_GETFD);
        if (flags < 0 || fcntl(keep[i], F_SETFD, flags & ~FD_CLOEXEC) < 0)
            fail("keep-fd", errno, "fd %d: %s", keep[i], strerror(errno));
    }
}

/*
 * Drop every capability for good (the process-level backends run without a
 * user namespace, so a root caller would otherwise keep root's powers).
 * SAFETY: the bounding set goes first (that needs CAP_SETPCAP, which the
 * capset below removes); an exec'd program of uid 0 then gains nothing. A
 * caller without capabilities cannot shrink the bounding set (EPERM) but has
 * nothing to drop: that is checked, not assumed.
 */
static void drop_capabilities(void) {
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &header, data) < 0)
        fail("drop-capabilities", errno, "capget: %s", strerror(errno));
    int could_drop = (data[0].effective >> CAP_SETPCAP) & 1;
    memset(data, 0, sizeof data);
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0)
            break; /* past the kernel's last capability */
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EPERM)
            fail("drop-capabilities", errno, "PR_CAPBSET_DROP %d: %s", cap, strerror(errno));
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        fail("drop-capabilities", errno, "clear ambient capabilities: %s", strerror(errno));
    if (syscall(SYS_capset, &header, data) < 0)
        fail("drop-capabilities", errno, "capset: %s", strerror(errno));
    /* Verify: nothing effective, permitted or in the bounding set remains. */
    if (syscall(SYS_capget, &header, data) < 0)
        fail("drop-capabilities", errno, "capget: %s", strerror(errno));
    if (data[0].effective | data[0].permitted | data[1].effective | data[1].permitted)
        fail("drop-capabilities", EPERM, "capabilities remain after capset");
    /* A caller that held no capabilities cannot shrink its bounding set, and
     * needs not: with no_new_privs (always set next) nothing it execs can gain
     * one. One that could drop them must have dropped them all. */
    if (!could_drop)
        return;
    for (int cap = 0; cap < 64; cap++) {
        int r = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
        if (r < 0)
            break;
        if (r == 1)
            fail("drop-capabilities", EPERM, "capability %d stays in the bounding set", cap);
    }
}

/*
 * --init: stay the sandbox's pid 1 and run the command as our child.
 *
 * bubblewrap's own init (and a container engine's) would be a process inside
 * the sandbox that holds none of corral's filters: the command could write
 * into its memory (/proc/1/mem) and run code there without the seccomp
 * filter. As init, this helper is started by ``bwrap --as-pid-1`` and forks
 * the command only *after* every filter is installed, so every process of the
 * sandbox - this one included - runs under them. On top of that it makes
 * itself non-dumpable, so the command (which holds no capability) cannot open
 * /proc/1/mem or ptrace it at all.
 *
 * The child becomes a session leader (and takes the pty with --ctty), marks
 * fds close-on-exec and execs the command; an exec failure is its "X" record.
 * The init keeps only the status fd: it reaps every process that ends up as
 * its child and, when the command itself ends, reports a terminating signal
 * as "S<signal>" (pid 1 cannot die of most signals, so its own exit status
 * cannot carry it) and exits with the command's status (128 + signal when
 * killed). The pid namespace - and everything left in it - ends with it.
 * It handles (blocked, taken by sigwaitinfo) the signals corral forwards -
 * HUP, INT, QUIT, TERM, USR1, USR2, WINCH, CONT, ALRM - and passes each on to
 * the command, also one that arrived before the command existed; every other
 * signal cannot reach it (pid 1 of a namespace gets only what it handles).
 *
 * With --serve, the init of a resident session forks one child per request
 * instead (serve_main).
 */
static const int forwarded_signals[] = {SIGHUP,  SIGINT,   SIGQUIT, SIGTERM, SIGUSR1,
                                         SIGUSR2, SIGWINCH, SIGCONT, SIGALRM};

static void note_signal(int sig) {
    (void)sig; /* never runs: the signals are blocked and taken by sigwaitinfo */
}

static sigset_t init_set, init_old_mask;

/* As early as possible: pid 1 gets only signals it handles, so handle (and
 * block) the ones corral forwards; one sent before the command exists then
 * waits for it. */
static void init_take_signals(void) {
    if (getpid() != 1)
        fail("init", EINVAL, "--init needs to be pid 1 of a new pid namespace (bwrap --as-pid-1)");
    sigemptyset(&init_set);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal;
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++) {
        sigaddset(&init_set, forwarded_signals[k]);
        sigaction(forwarded_signals[k], &sa, NULL);
    }
    sigaddset(&init_set, SIGCHLD);
    sigaction(SIGCHLD, &sa, NULL);
    if (sigprocmask(SIG_BLOCK, &init_set, &init_old_mask) < 0)
        fail("init", errno, "sigprocmask: %s", strerror(errno));
}

static void run_as_init(void) {
    sigset_t set = init_set, old = init_old_mask;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    pid_t child = fork();
    if (child < 0)
        fail("init", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        sa.sa_handler = SIG_DFL;
        for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++)
            sigaction(forwarded_signals[k], &sa, NULL);
        sigaction(SIGCHLD, &sa, NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (setsid() < 0)
            fail("setsid", errno, "%s", strerror(errno));
        if (want_ctty_global && ioctl(0, TIOCSCTTY, 0) < 0)
            fail("set-controlling-terminal", errno, "%s", strerror(errno));
        return; /* the caller marks fds close-on-exec and execs the command */
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        fail("init", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    /* hold nothing of the command's: stdio, the pty, kept fds, pipes */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (status_fd >= 0 && status_fd != 3) {
        if (dup2(status_fd, 3) < 0)
            _exit(125);
        status_fd = 3;
    }
    syscall(__NR_close_range, status_fd >= 0 ? 4U : 3U, ~0U, 0U);
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig < 0)
            continue; /* EINTR */
        if (sig != SIGCHLD) {
            kill(child, sig); /* corral's signal for the command */
            continue;
        }
        for (;;) {
            int wstatus;
            pid_t pid = waitpid(-1, &wstatus, WNOHANG);
            if (pid <= 0)
                break;
            if (pid != child)
                continue; /* an orphan the command left behind */
            if (WIFSIGNALED(wstatus)) {
                char line[16];
                int n = snprintf(line, sizeof line, "S%d\n", WTERMSIG(wstatus));
                status_write(line, (size_t)n);
                _exit(128 + WTERMSIG(wstatus));
            }
            _exit(WEXITSTATUS(wstatus));
        }
    }
}

/*
 * --reaper SIG: no pid namespace (the landlock backend), yet nothing the
 * command started may outlive it, however it detached (setsid, double fork).
 *
 * Called after no_new_privs and before Landlock: this process forks and stays
 * the command's parent, OUTSIDE the command's Landlock domain, so with
 * Landlock's signal scope (ABI >= 6) the command cannot signal it, and
 * Landlock's ptrace rule (any ABI: no ptrace-style access from a domain to a
 * process outside it), the seccomp filter's ptrace denial and PR_SET_DUMPABLE 0
 * keep it from being traced or having its memory opened. It marks itself
 * PR_SET_CHILD_SUBREAPER, so every process the command orphans re-parents to
 * it instead of to the host's init. It keeps only the status fd, takes every
 * signal through sigwaitinfo (corral's forwarded signals reach the command's
 * process group directly; the helper ignores them, except a hang-up of the
 * controlling terminal, which the kernel sends the session leader - this
 * process - alone: passed on to the command) and ends the tree:
 *   - when the command (its child) ends, or
 *   - on SIG: corral's "stop everything" (timeout, cancel, --stop) and the
 *     helper's parent-death signal (corral gone), set by --die-with-parent;
 * by SIGKILLing every child listed in /proc/self/task/TID/children and reaping,
 * again and again until waitpid() says there is no child left. A descendant
 * of a killed process re-parents to this subreaper before its parent can be
 * reaped, and a fork racing with SIGKILL either fails or yields a child that
 * the next pass kills, so "no child left" means "no descendant left". It then
 * exits as the command did (an "S<signal>" record and 128 + signal when killed).
 * The command's own process gets SIGKILL as parent-death signal, should this
 * process ever go first.
 */
static void sigkill_children(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        char tail[16];
        size_t ntail = 0;
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
            for (ssize_t k = 0; k < n; k++) {
                if (buf[k] >= '0' && buf[k] <= '9') {
                    if (ntail < sizeof tail - 1)
                        tail[ntail++] = buf[k];
                    continue;
                }
                if (ntail > 0) {
                    tail[ntail] = '\0';
                    kill((pid_t)atol(tail), SIGKILL);
                    ntail = 0;
                }
            }
        }
        if (ntail > 0) {
            tail[ntail] = '\0';
            kill((pid_t)atol(tail), SIGKILL);
        }
        close(fd);
        return;
    }
    /* no CONFIG_PROC_CHILDREN: find the children in /proc/PID/stat */
    DIR *dir = opendir("/proc");
    if (dir == NULL)
        return;
    pid_t self = getpid();
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '1' || entry->d_name[0] > '9')
            continue;
        char stat_path[300], stat[512];
        snprintf(stat_path, sizeof stat_path, "/proc/%s/stat", entry->d_name);
        int sfd = open(stat_path, O_RDONLY | O_CLOEXEC);
        if (sfd < 0)
            continue;
        ssize_t n = read(sfd, stat, sizeof stat - 1);
        close(sfd);
        if (n <= 0)
            continue;
        stat[n] = '\0';
        char *end = strrchr(stat, ')'); /* the name may hold spaces and parens */
        int ppid;
        char state;
        if (end != NULL && sscanf(end + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)self)
            kill((pid_t)atol(entry->d_name), SIGKILL);
    }
    closedir(dir);
}

static void run_as_reaper(void) {
    sigset_t all, old;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal; /* SIGCHLD must not be discarded as "ignored" */
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(reap_signal, &sa, NULL); /* taken by sigwaitinfo, even if inherited as ignored */
    sigfillset(&all);
    if (sigprocmask(SIG_BLOCK, &all, &old) < 0)
        fail("reaper", errno, "sigprocmask: %s", strerror(errno));
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        fail("reaper", errno, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    pid_t self = getpid();
    pid_t child = fork();
    if (child < 0)
        fail("reaper", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        sa.sa_handler = SIG_DFL;
        sigaction(SIGCHLD, &sa, NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != self)
            fail("reaper", errno, "the helper went away before the command started");
        return; /* the caller applies Landlock and seccomp and execs the command */
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
        kill(child, SIGKILL);
        fail("reaper", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    }
    /* hold nothing of the command's: stdio, the pty, kept fds, pipes */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (status_fd >= 0 && status_fd != 3) {
        if (dup2(status_fd, 3) < 0) {
            kill(child, SIGKILL);
            _exit(125);
        }
        status_fd = 3;
    }
    syscall(__NR_close_range, status_fd >= 0 ? 4U : 3U, ~0U, 0U);
    int command_status = 0, ended = 0;
    for (;;) {
        siginfo_t info;
        int sig = sigwaitinfo(&all, &info);
        if (sig == SIGHUP && info.si_code == SI_KERNEL) {
            /* a hang-up of the controlling terminal signals the session leader
             * only, which is this process now: the command (a shell) gets it */
            kill(child, SIGHUP);
            kill(child, SIGCONT);
            continue;
        }
        if (sig == SIGCHLD) {
            int wstatus;
            pid_t pid;
            while ((pid = waitpid(-1, &wstatus, WNOHANG)) > 0)
                if (pid == child) {
                    command_status = wstatus;
                    ended = 1;
                }
            if (!ended)
                continue; /* an orphan the command left behind */
        } else if (sig != reap_signal) {
            continue; /* sent to the group: the command got it as well */
        }
        break;
    }
    for (;;) {
        sigkill_children();
        int wstatus;
        pid_t pid = waitpid(-1, &wstatus, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD: no child, so no descendant, is left */
        }
        if (pid == child && !ended) {
            command_status = wstatus;
            ended = 1;
        }
    }
    if (WIFSIGNALED(command_status)) {
        char line[16];
        int n = snprintf(line, sizeof line, "S%d\n", WTERMSIG(command_status));
        status_write(line, (size_t)n);
        _exit(128 + WTERMSIG(command_status));
    }
    _exit(WEXITSTATUS(command_status));
}

/*
 * --init --serve FD: the pid 1 of a resident session (corral.pipeline._resident).
 *
 * Every filter is installed already; this process spawns each command corral
 * sends on FD (a SOCK_SEQPACKET socket) in the sandbox's namespaces and under
 * its filters, one command at a time, so a further command costs a fork and
 * an exec instead of a new sandbox. Requests (one message each):
 *   C<cwd>\0<argc>\0<arg>\0...<NAME=value>\0...   with 3 fds (SCM_RIGHTS): the
 *                                   command's stdin, stdout and stderr
 *   S<signal>                       send <signal> to the command
 *   K[<signal>]                     send <signal> (default SIGKILL) to every process
 *                                   of the sandbox but this one
 * Replies:
 *   P<pid>                          the command was forked
 *   E<step>\t<errno>\t<text>        it could not be set up (the command did not run;
 *                                   "D" follows, with exit status 125)
 *   X<errno>\t<program>             its exec failed (exit status 127 or 126 follows)
 *   D<wait status>                  it ended, and so did everything it started
 * After the command ends, every process left in the pid namespace is killed
 * and reaped before "D" is sent: nothing of one command survives into the
 * next. The child is a session leader, holds none of the init's fds and
 * execs with the environment given (corral computes it as for a fresh
 * sandbox). End of file on FD ends the init, and with it the namespace.
 */
#define SERVE_MAX (256 * 1024)
#define SERVE_MAX_ARGS 4096

static void serve_reply(const char *buf, size_t len) {
    ssize_t n;
    do {
        n = send(serve_fd, buf, len, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
}

static void serve_fail(const char *step, int err, const char *text) {
    char line[700];
    int n = snprintf(line, sizeof line, "E%s\t%d\t%s", step, err, text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    serve_reply(line, (size_t)n);
}

/* In the forked child: become the command (never returns). */
static void serve_exec(char *cwd, char **args, char **envp, const int fds[3], const sigset_t *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++)
        sigaction(forwarded_signals[k], &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigprocmask(SIG_SETMASK, old, NULL);
    if (setsid() < 0) {
        serve_fail("setsid", errno, strerror(errno));
        _exit(125);
    }
    int high[3];
    for (int k = 0; k < 3; k++) {
        /* above the stdio numbers first: a received fd may be 0, 1 or 2 */
        high[k] = fcntl(fds[k], F_DUPFD_CLOEXEC, 10);
        if (high[k] < 0) {
            serve_fail("set-up-stdio", errno, strerror(errno));
            _exit(125);
        }
    }
    for (int k = 0; k < 3; k++) {
        if (dup2(high[k], k) < 0) {
            serve_fail("set-up-stdio", errno, strerror(errno));
            _exit(125);
        }
    }
    if (cwd[0] != '\0' && chdir(cwd) < 0) {
        char text[600];
        snprintf(text, sizeof text, "%s: %s", cwd, strerror(errno));
        serve_fail("chdir", errno, text);
        _exit(125);
    }
    /* the control socket and the status fd close on exec: a failure can still be told */
    if (syscall(__NR_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC_FLAG) < 0) {
        serve_fail("close-inherited-fds", errno, strerror(errno));
        _exit(125);
    }
    execvpe(args[0], args, envp);
    int err = errno;
    char line[600];
    int n = snprintf(line, sizeof line, "X%d\t%s", err, args[0]);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    serve_reply(line, (size_t)n);
    _exit(err == ENOENT ? 127 : 126);
}

/* Kill everything in the namespace but us, and reap it all. */
static void serve_sweep(void) {
    for (;;) {
        if (kill(-1, SIGKILL) < 0 && errno == ESRCH)
            return; /* nothing left: from pid 1, -1 is every other process of the namespace */
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
        }
    }
}

static pid_t serve_spawn(char *msg, size_t len, const int fds[3], const sigset_t *old) {
    /* C<cwd>\0<argc>\0<argv...>\0<env...>\0 */
    static char *args[SERVE_MAX_ARGS + 1], *envp[SERVE_MAX_ARGS + 1];
    char *p = msg + 1, *end = msg + len;
    if (len < 2 || end[-1] != '\0') {
        serve_fail("parse-request", EINVAL, "a request must end in a NUL");
        return -1;
    }
    char *cwd = p;
    p += strlen(p) + 1;
    if (p >= end) {
        serve_fail("parse-request", EINVAL, "no argument count");
        return -1;
    }
    long argc = strtol(p, NULL, 10);
    p += strlen(p) + 1;
    if (argc < 1 || argc > SERVE_MAX_ARGS) {
        serve_fail("parse-request", EINVAL, "bad argument count");
        return -1;
    }
    for (long k = 0; k < argc; k++) {
        if (p >= end) {
            serve_fail("parse-request", EINVAL, "fewer arguments than counted");
            return -1;
        }
        args[k] = p;
        p += strlen(p) + 1;
    }
    args[argc] = NULL;
    int nenv = 0;
    while (p < end && nenv < SERVE_MAX_ARGS) {
        envp[nenv++] = p;
        p += strlen(p) + 1;
    }
    envp[nenv] = NULL;
    pid_t child = fork();
    if (child < 0) {
        serve_fail("fork", errno, strerror(errno));
        return -1;
    }
    if (child == 0)
        serve_exec(cwd, args, envp, fds, old);
    return child;
}

static void serve_main(void) {
    static char msg[SERVE_MAX];
    sigset_t old = init_old_mask;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        fail("init", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    int sigfd = signalfd(-1, &init_set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0)
        fail("init", errno, "signalfd: %s", strerror(errno));
    /* hold nothing of the first command's stdio; keep status (3), control (4), signals (5) */
    int keep[3] = {status_fd, serve_fd, sigfd};
    int moved[3];
    for (int k = 0; k < 3; k++) {
        moved[k] = fcntl(keep[k], F_DUPFD_CLOEXEC, 10);
        if (moved[k] < 0)
            fail("init", errno, "fcntl: %s", strerror(errno));
    }
    for (int fd = 0; fd < 3; fd++)
        close(fd); /* (received fds may land here: serve_exec moves them first) */
    for (int k = 0; k < 3; k++) {
        if (dup3(moved[k], 3 + k, O_CLOEXEC) < 0)
            _exit(125);
    }
    status_fd = 3;
    serve_fd = 4;
    sigfd = 5;
    syscall(__NR_close_range, 6U, ~0U, 0U);
    pid_t child = 0;
    for (;;) {
        struct pollfd polls[2] = {{.fd = serve_fd, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
        if (poll(polls, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(125);
        }
        if (polls[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) == (ssize_t)sizeof info) {
                if ((int)info.ssi_signo != SIGCHLD) {
                    if (child > 0)
                        kill(child, (int)info.ssi_signo);
                    continue;
                }
            }
            int wstatus;
            pid_t pid;
            while ((pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
                if (pid != child)
                    continue; /* something the command left behind */
                serve_sweep();
                child = 0;
                char line[32];
                int n = snprintf(line, sizeof line, "D%d", wstatus);
                serve_reply(line, (size_t)n);
            }
        }
        if (!(polls[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        char cbuf[CMSG_SPACE(3 * sizeof(int))];
        struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        ssize_t len = recvmsg(serve_fd, &mh, MSG_CMSG_CLOEXEC);
        if (len < 0 && errno == EINTR)
            continue;
        if (len <= 0)
            _exit(0); /* corral closed the session (or went away): the namespace ends */
        int fds[3] = {-1, -1, -1};
        int nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int k = 0; k < got; k++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
                    if (nfds < 3)
                        fds[nfds++] = fd;
                    else
                        close(fd);
                }
            }
        }
        if (msg[0] == 'C') {
            if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                serve_fail("parse-request", E2BIG, "the request is too long");
                serve_reply("D32000", 6);
            }
            else if (child > 0)
                serve_fail("spawn", EBUSY, "a command is running");
            else if (nfds != 3)
                serve_fail("parse-request", EINVAL, "a command needs 3 fds");
            else {
                child = serve_spawn(msg, (size_t)len, fds, &old);
                char line[32];
                int n = child > 0 ? snprintf(line, sizeof line, "P%d", (int)child)
                                  : snprintf(line, sizeof line, "D%d", 125 << 8);
                serve_reply(line, (size_t)n); /* after a failure, its "E" and the end */
                if (child < 0)
                    child = 0;
            }
        } else if (msg[0] == 'S' && child > 0) {
            /* the command's process group (it is a session leader), as a terminal signals a
             * job and as a fresh sandbox's signal is delivered: `sh -c 'sleep 9; echo'` stops
             * at once on SIGINT instead of after the sleep */
            msg[len < (ssize_t)sizeof msg ? len : (ssize_t)sizeof msg - 1] = '\0';
            int sig = (int)strtol(msg + 1, NULL, 10);
            if (kill(-child, sig) < 0)
                kill(child, sig);
        } else if (msg[0] == 'K') {
            /* every process but this one; the command's reaping above sends "D" */
            msg[len < (ssize_t)sizeof msg ? len : (ssize_t)sizeof msg - 1] = '\0';
            kill(-1, len > 1 ? (int)strtol(msg + 1, NULL, 10) : SIGKILL);
        }
        for (int k = 0; k < nfds; k++)
            close(fds[k]);
    }
}

/*
 * --hold: the pid 1 of a session container (podman), in place of catatonit
 * and ``sleep infinity``. Each command of the session is started by the engine
 * (``podman exec``) under this helper's main mode, with corral's filters; this
 * process only reaps the orphans they leave, and it is not dumpable, so no
 * command can write into its memory or trace it. SIGTERM or SIGINT end it (and
 * with it the container).
 */
static int hold_main(void) {
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return 125;
    sigset_t set;
    sigemptyset(&set);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal;
    const int taken[] = {SIGTERM, SIGINT, SIGCHLD};
    for (size_t k = 0; k < sizeof taken / sizeof taken[0]; k++) {
        sigaddset(&set, taken[k]);
        sigaction(taken[k], &sa, NULL);
    }
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return 125;
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3 && null >= 0; fd++)
        dup2(null, fd);
    syscall(__NR_close_range, 3U, ~0U, 0U);
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig == SIGTERM || sig == SIGINT)
            _exit(0);
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

static void usage(void) {
    fputs("usage: corral-exec [--status-fd N] [--seccomp-fd N | --seccomp-file PATH]... [--notify-fd N --notify-sock N]\n"
          "                   [--landlock-fd N] [--rlimit NAME=SOFT:HARD]... [--keep-fd N]... [--wait-fd N]\n"
          "                   [--chdir DIR] [--setsid] [--ctty] [--drop-caps] [--init] [--reaper SIG]\n"
          "                   [--die-with-parent PPID]\n"
          "                   -- COMMAND [ARG...]\n",
          stderr);
    _exit(125);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--mount-overlay") == 0)
        return mount_overlay_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--as-user") == 0)
        return as_user_main(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--hold") == 0)
        return hold_main();
    int seccomp_fds[MAX_FILTERS];
    int nseccomp = 0;
    int notify_fd = -1, notify_sock = -1, landlock_fd = -1, wait_fd = -1;
    int keep[MAX_KEEP];
    int nkeep = 0;
    struct { int res; struct rlimit lim; } rlimits[MAX_RLIMITS];
    int nrlimits = 0;
    const char *chdir_to = NULL;
    int want_setsid = 0, want_ctty = 0, want_drop_caps = 0;
    long parent_pid = -1;
    int i = 1;

    /* The status fd comes first so that argument errors can be reported. */
    for (int j = 1; j + 1 < argc; j++) {
        if (strcmp(argv[j], "--") == 0)
            break;
        if (strcmp(argv[j], "--status-fd") == 0) {
            status_fd = (int)parse_long(argv[j + 1], "--status-fd");
            fcntl(status_fd, F_SETFD, FD_CLOEXEC);
            break;
        }
    }
    status_write("R\n", 2);

    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc && strcmp(a, "--setsid") != 0 && strcmp(a, "--ctty") != 0 &&
            strcmp(a, "--drop-caps") != 0 && strcmp(a, "--init") != 0)
            usage();
        if (strcmp(a, "--status-fd") == 0) {
            i++;
        } else if (strcmp(a, "--seccomp-fd") == 0) {
            if (nseccomp == MAX_FILTERS)
                fail("parse-arguments", E2BIG, "too many --seccomp-fd");
            seccomp_fds[nseccomp++] = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--seccomp-file") == 0) {
            /* an engine that cannot pass fds (docker) binds the program in read-only */
            if (nseccomp == MAX_FILTERS)
                fail("parse-arguments", E2BIG, "too many --seccomp-fd");
            int fd = open(argv[++i], O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                fail("install-seccomp-filter", errno, "%s: %s", argv[i], strerror(errno));
            seccomp_fds[nseccomp++] = fd;
        } else if (strcmp(a, "--notify-fd") == 0) {
            notify_fd = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--notify-sock") == 0) {
            notify_sock = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--wait-fd") == 0) {
            wait_fd = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--landlock-fd") == 0) {
            landlock_fd = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--keep-fd") == 0) {
            if (nkeep == MAX_KEEP)
                fail("parse-arguments", E2BIG, "too many --keep-fd");
            keep[nkeep++] = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--chdir") == 0) {
            chdir_to = argv[++i];
        } else if (strcmp(a, "--setsid") == 0) {
            want_setsid = 1;
        } else if (strcmp(a, "--ctty") == 0) {
            want_ctty = want_ctty_global = 1;
        } else if (strcmp(a, "--drop-caps") == 0) {
            want_drop_caps = 1;
        } else if (strcmp(a, "--init") == 0) {
            want_init = 1;
        } else if (strcmp(a, "--reaper") == 0) {
            reap_signal = (int)parse_long(argv[++i], a);
            if (reap_signal < 1 || reap_signal > SIGRTMAX || reap_signal == SIGKILL ||
                reap_signal == SIGSTOP || reap_signal == SIGCHLD)
                fail("parse-arguments", EINVAL, "bad --reaper signal %d", reap_signal);
        } else if (strcmp(a, "--serve") == 0) {
            serve_fd = (int)parse_long(argv[++i], a);
        } else if (strcmp(a, "--die-with-parent") == 0) {
            parent_pid = parse_long(argv[++i], a);
        } else if (strcmp(a, "--rlimit") == 0) {
            char spec[128];
            snprintf(spec, sizeof spec, "%s", argv[++i]);
            char *eq = strchr(spec, '=');
            char *colon = eq ? strchr(eq, ':') : NULL;
            if (!eq || !colon || nrlimits == MAX_RLIMITS)
                fail("parse-arguments", EINVAL, "bad --rlimit %s", argv[i]);
            *eq = '\0';
            *colon = '\0';
            rlimits[nrlimits].res = rlimit_resource(spec);
            rlimits[nrlimits].lim.rlim_cur = (rlim_t)strtoull(eq + 1, NULL, 10);
            rlimits[nrlimits].lim.rlim_max = (rlim_t)strtoull(colon + 1, NULL, 10);
            nrlimits++;
        } else {
            fail("parse-arguments", EINVAL, "unknown option %s", a);
        }
    }
    if (i >= argc)
        fail("parse-arguments", EINVAL, "no command given");
    if (want_init)
        init_take_signals();
    if (serve_fd >= 0 && !want_init)
        fail("parse-arguments", EINVAL, "--serve needs --init");
    if (reap_signal && want_init)
        fail("parse-arguments", EINVAL, "--reaper and --init exclude each other");
    if ((notify_fd < 0) != (notify_sock < 0))
        fail("parse-arguments", EINVAL, "--notify-fd and --notify-sock go together");

    /* 1b. corral may need to place us (e.g. into cgroups) before anything runs */
    if (wait_fd >= 0) {
        char byte;
        ssize_t n;
        do {
            n = read(wait_fd, &byte, 1);
        } while (n < 0 && errno == EINTR);
        if (n != 1)
            fail("wait-for-corral", n < 0 ? errno : EPIPE, "corral went away before the start signal");
        close(wait_fd);
    }

    /* 2. session, lifetime, directory (as init, the session is the child's: 7b) */
    if (want_setsid && !want_init && setsid() < 0)
        fail("setsid", errno, "%s", strerror(errno));
    if (want_ctty && !want_init) {
        /* An interactive shell on corral's private pty: become a session leader
         * (bubblewrap's init leads the sandbox's first session) and take the
         * pty on stdin as controlling terminal. TIOCSTI on it can only inject
         * input into this sandbox. */
        if (!want_setsid)
            (void)setsid();
        if (ioctl(0, TIOCSCTTY, 0) < 0)
            fail("set-controlling-terminal", errno, "%s", strerror(errno));
    }
    if (parent_pid >= 0) {
        /* 0 means "whoever started us"; read it before arming the signal so a
         * parent that already died is noticed below. */
        if (parent_pid == 0)
            parent_pid = (long)getppid();
        /* a reaper takes its signal to end the command's tree first */
        if (prctl(PR_SET_PDEATHSIG, reap_signal ? reap_signal : SIGKILL, 0, 0, 0) < 0)
            fail("set-parent-death-signal", errno, "%s", strerror(errno));
        /* The parent may have died before the prctl took effect. */
        if (getppid() != (pid_t)parent_pid)
            fail("set-parent-death-signal", ESRCH, "parent %ld already exited", parent_pid);
    }
    if (chdir_to != NULL && chdir(chdir_to) < 0)
        fail("chdir", errno, "%s: %s", chdir_to, strerror(errno));

    /* 3. resource limits */
    for (int k = 0; k < nrlimits; k++)
        if (setrlimit(rlimits[k].res, &rlimits[k].lim) < 0)
            fail("setrlimit", errno, "resource %d: %s", rlimits[k].res, strerror(errno));

    /* 3b. capabilities (after setrlimit, which may need CAP_SYS_RESOURCE) */
    if (want_drop_caps)
        drop_capabilities();

    /* 4. no_new_privs: required before Landlock/seccomp without CAP_SYS_ADMIN,
     * and it makes set-user-ID binaries inert for the rest of the tree. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        fail("set-no-new-privs", errno, "%s", strerror(errno));

    /* 4b. the reaper stays outside the command's Landlock domain and seccomp filters */
    if (reap_signal)
        run_as_reaper();

    /* 5. Landlock */
    if (landlock_fd >= 0)
        apply_landlock(landlock_fd);

    /* 6. seccomp deny filters, in the order given */
    for (int k = 0; k < nseccomp; k++)
        install_filter(seccomp_fds[k], 0, "install-seccomp-filter");

    /* 7. the write-broker filter; its listener goes to corral */
    if (notify_fd >= 0) {
        int listener = install_filter(notify_fd, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                                      "install-notify-filter");
        send_fd(notify_sock, listener);
        close(listener);
        close(notify_sock);
    }

    /* 7b. as the sandbox's init: the command runs in a child; we stay pid 1 */
    if (serve_fd >= 0)
        serve_main();
    if (want_init)
        run_as_init();

    /* 8. nothing but stdio and kept fds crosses into the command */
    cloexec_all(keep, nkeep);

    /* 9. run the command */
    execvp(argv[i], argv + i);
    int err = errno;
    char line[600];
    int n = snprintf(line, sizeof line, "X%d\t%s\n", err, argv[i]);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (status_fd >= 0)
        status_write(line, (size_t)n);
    else
        fprintf(stderr, "corral-exec: %s: %s\n", argv[i], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}
