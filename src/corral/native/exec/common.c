/*
 * exec/common.c: what every mode of corral-exec uses - the status fd and its
 * failure record, argument parsing - and the main mode's restriction steps:
 * seccomp filters, the notification listener's hand-over, Landlock, rlimits,
 * close-on-exec, dropping capabilities.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helper.h"

#define MAX_PROGRAM (64 * 1024)

int cx_status_fd = -1;

void cx_status_write(const char *buf, size_t len) {
    if (cx_status_fd < 0)
        return;
    while (len > 0) {
        ssize_t n = write(cx_status_fd, buf, len);
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
void cx_fail(const char *step, int err, const char *fmt, ...) {
    char text[512];
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, "E%s\t%d\t%s\n", step, err, text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (cx_status_fd >= 0)
        cx_status_write(line, (size_t)n);
    else
        fprintf(stderr, "corral-exec: failed to %s: %s\n", step, text);
    _exit(125);
}

long cx_parse_long(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        cx_fail("parse-arguments", EINVAL, "bad number for %s: %s", what, s);
    return v;
}

/* Read a whole fd (a BPF program or a Landlock spec) into buf. */
static size_t read_all(int fd, unsigned char *buf, size_t cap, const char *what) {
    size_t got = 0;
    for (;;) {
        if (got == cap)
            cx_fail(what, E2BIG, "input larger than %zu bytes", cap);
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            cx_fail(what, errno, "read fd %d: %s", fd, strerror(errno));
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got;
}

int cx_install_filter(int fd, unsigned long flags, const char *step) {
    static unsigned char buf[MAX_PROGRAM];
    size_t len = read_all(fd, buf, sizeof buf, step);
    if (len == 0 || len % sizeof(struct sock_filter) != 0)
        cx_fail(step, EINVAL, "BPF program of %zu bytes is not a whole number of instructions", len);
    struct sock_fprog prog = {
        .len = (unsigned short)(len / sizeof(struct sock_filter)),
        .filter = (struct sock_filter *)buf,
    };
    long r = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (r < 0)
        cx_fail(step, errno, "seccomp(SET_MODE_FILTER): %s", strerror(errno));
    return (int)r;
}

void cx_send_fd(int sock, int fd) {
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
        cx_fail("send-notify-listener", errno, "sendmsg: %s", strerror(errno));
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

void cx_apply_landlock(int fd) {
    static unsigned char buf[MAX_PROGRAM];
    size_t len = read_all(fd, buf, sizeof buf, "read-landlock-spec");
    if (len < 24)
        cx_fail("apply-landlock", EINVAL, "spec too short");
    struct ll_ruleset_attr attr;
    memcpy(&attr, buf, 24);
    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, 1UL /* VERSION */);
    if (abi < 1)
        cx_fail("apply-landlock", errno, "Landlock is not available: %s", strerror(errno));
    size_t attr_size = attr.scoped ? 24 : (attr.handled_access_net ? 16 : 8);
    long rfd = syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0UL);
    if (rfd < 0)
        cx_fail("apply-landlock", errno, "landlock_create_ruleset: %s", strerror(errno));
    size_t off = 24;
    while (off < len) {
        if (len - off < 16)
            cx_fail("apply-landlock", EINVAL, "truncated rule header");
        uint32_t kind, plen;
        uint64_t access;
        memcpy(&kind, buf + off, 4);
        memcpy(&plen, buf + off + 4, 4);
        memcpy(&access, buf + off + 8, 8);
        off += 16;
        if (plen > len - off)
            cx_fail("apply-landlock", EINVAL, "truncated rule payload");
        if (kind == 1) {
            const char *path = (const char *)(buf + off);
            if (plen == 0 || path[plen - 1] != '\0')
                cx_fail("apply-landlock", EINVAL, "path rule is not NUL-terminated");
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
                cx_fail("apply-landlock", errno, "landlock_add_rule %s: %s", path, strerror(errno));
            close(pfd);
        } else if (kind == 2) {
            if (plen != 8)
                cx_fail("apply-landlock", EINVAL, "port rule payload must be 8 bytes");
            struct ll_net_port np;
            np.allowed_access = access;
            memcpy(&np.port, buf + off, 8);
            if (syscall(__NR_landlock_add_rule, rfd, 2 /* NET_PORT */, &np, 0) < 0)
                cx_fail("apply-landlock", errno, "landlock_add_rule port %llu: %s",
                     (unsigned long long)np.port, strerror(errno));
        } else {
            cx_fail("apply-landlock", EINVAL, "unknown rule kind %u", kind);
        }
        off += plen;
    }
    if (syscall(__NR_landlock_restrict_self, rfd, 0) < 0)
        cx_fail("apply-landlock", errno, "landlock_restrict_self: %s", strerror(errno));
    close((int)rfd);
}

int cx_rlimit_resource(const char *name) {
    static const struct { const char *name; int res; } table[] = {
        {"as", RLIMIT_AS},       {"core", RLIMIT_CORE},     {"cpu", RLIMIT_CPU},
        {"data", RLIMIT_DATA},   {"fsize", RLIMIT_FSIZE},   {"nofile", RLIMIT_NOFILE},
        {"nproc", RLIMIT_NPROC}, {"stack", RLIMIT_STACK},   {"memlock", RLIMIT_MEMLOCK},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].res;
    cx_fail("parse-arguments", EINVAL, "unknown rlimit %s", name);
    return -1;
}

/* Mark every fd >= 3 close-on-exec, then clear the flag on the kept ones. */
void cx_cloexec_all(const int *keep, int nkeep) {
    if (syscall(__NR_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC_FLAG) < 0) {
        DIR *d = opendir("/proc/self/fd");
        if (d == NULL)
            cx_fail("close-inherited-fds", errno, "close_range and /proc/self/fd both unavailable");
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
            cx_fail("keep-fd", errno, "fd %d: %s", keep[i], strerror(errno));
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
void cx_drop_capabilities(void) {
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &header, data) < 0)
        cx_fail("drop-capabilities", errno, "capget: %s", strerror(errno));
    int could_drop = (data[0].effective >> CAP_SETPCAP) & 1;
    memset(data, 0, sizeof data);
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0)
            break; /* past the kernel's last capability */
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EPERM)
            cx_fail("drop-capabilities", errno, "PR_CAPBSET_DROP %d: %s", cap, strerror(errno));
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        cx_fail("drop-capabilities", errno, "clear ambient capabilities: %s", strerror(errno));
    if (syscall(SYS_capset, &header, data) < 0)
        cx_fail("drop-capabilities", errno, "capset: %s", strerror(errno));
    /* Verify: nothing effective, permitted or in the bounding set remains. */
    if (syscall(SYS_capget, &header, data) < 0)
        cx_fail("drop-capabilities", errno, "capget: %s", strerror(errno));
    if (data[0].effective | data[0].permitted | data[1].effective | data[1].permitted)
        cx_fail("drop-capabilities", EPERM, "capabilities remain after capset");
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
            cx_fail("drop-capabilities", EPERM, "capability %d stays in the bounding set", cap);
    }
}
