/*
 * exec/serve.c: corral-exec --init --serve FD, the pid 1 of a resident
 * session, which spawns each command corral sends on its control socket.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"

/*
 * --init --serve FD: the pid 1 of a resident session (corral.pipeline._resident).
 *
 * Every filter is installed already; this process spawns each command corral
 * sends on FD (a SOCK_SEQPACKET socket) in the sandbox's namespaces and under
 * its filters, one command at a time, so a further command costs a fork and
 * an exec instead of a new sandbox. Requests (one message each):
 *   C<cwd>\0<argc>\0<arg>\0...<NAME=value>\0...   with 3 fds (SCM_RIGHTS): the
 *                                   command's stdin, stdout and stderr; and
 *                                   optionally up to 3 more, which the command
 *                                   gets as fds 63, 61 and 62 (a kept session's
 *                                   shell state channel, and the script and go
 *                                   channels of a shell started ahead for the
 *                                   session's next call: corral.server._kept)
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
/* where a request's 4th, 5th and 6th fds reach the command: high, so that a
 * script's own `exec 3>file` never receives them (corral.integrations.claude_code_hook,
 * corral.server._kept) */
#define CX_SERVE_FDS 6
static const int serve_extra_fds[CX_SERVE_FDS - 3] = {63, 61, 62};

static void serve_reply(const char *buf, size_t len) {
    ssize_t n;
    do {
        n = send(cx_serve_fd, buf, len, MSG_NOSIGNAL);
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
static void serve_exec(char *cwd, char **args, char **envp, const int fds[CX_SERVE_FDS],
                       const sigset_t *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (size_t k = 0; k < cx_nforwarded_signals; k++)
        sigaction(cx_forwarded_signals[k], &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigprocmask(SIG_SETMASK, old, NULL);
    if (setsid() < 0) {
        serve_fail("setsid", errno, strerror(errno));
        _exit(125);
    }
    int high[CX_SERVE_FDS];
    for (int k = 0; k < CX_SERVE_FDS; k++) {
        high[k] = -1;
        if (fds[k] < 0)
            continue; /* fewer than 6 */
        /* above the stdio numbers and the extras' targets first: a received fd may be
         * 0, 1 or 2, or one of 61-63 */
        high[k] = fcntl(fds[k], F_DUPFD_CLOEXEC, 64);
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
    for (int k = 3; k < CX_SERVE_FDS; k++) {
        int target = serve_extra_fds[k - 3];
        if (high[k] >= 0 && (dup2(high[k], target) < 0 || fcntl(target, F_SETFD, 0) < 0)) {
            serve_fail("set-up-channels", errno, strerror(errno));
            _exit(125);
        }
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

/*
 * What a forked command inherits from this process and another process of the
 * sandbox can change in it without ptrace rights - only the same uid:
 * resource limits (prlimit), nice, scheduling policy and attributes
 * (setpriority, sched_setattr), CPU affinity, I/O priority, the timer slack,
 * and the files of /proc/1 that its owner may write - which for a root caller
 * is the command's own uid 0 of the user namespace - the OOM score adjustment
 * and the core dump filter (its autogroup is not inherited: every command
 * starts a session, and so an autogroup, of its own; comm is refused). It is taken when serving begins and
 * compared before every spawn: a command that changed any of it (ATK18:
 * `prlimit --pid 1` lowered every later command's limits, and at 64
 * descriptors no command could be set up) gets no further command here -
 * the spawn fails with "init-changed", and corral retires the sandbox and
 * runs that command in a new one. Lowered hard limits cannot be raised back.
 */
struct init_state {
    struct rlimit limits[RLIM_NLIMITS];
    int limits_ok[RLIM_NLIMITS];
    int nice;
    cpu_set_t cpus;
    int cpus_ok;
    unsigned char attr[56]; /* struct sched_attr, SCHED_ATTR_SIZE_VER1 */
    long attr_ok;
    long ioprio;
    long timerslack;
    char oom[24];
    char coredump[24];
};

/* The first line of /proc/self/NAME into BUF (empty when it cannot be read). */
static void read_proc_self(const char *name, char *buf, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/%s", name);
    buf[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, size - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
}

static void init_state_read(struct init_state *s) {
    memset(s, 0, sizeof *s);
    for (int r = 0; r < RLIM_NLIMITS; r++)
        s->limits_ok[r] = getrlimit(r, &s->limits[r]) == 0;
    errno = 0;
    s->nice = getpriority(PRIO_PROCESS, 0);
    if (errno != 0)
        s->nice = -1000;
    s->cpus_ok = sched_getaffinity(0, sizeof s->cpus, &s->cpus) == 0;
    s->attr_ok = syscall(SYS_sched_getattr, 0, s->attr, sizeof s->attr, 0);
    s->ioprio = syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, 0);
    s->timerslack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    /* files of /proc/1 the command may write: for a root caller the init's /proc files
     * belong to uid 0 of the user namespace, the command's own uid (ATK19) */
    read_proc_self("oom_score_adj", s->oom, sizeof s->oom);
    read_proc_self("coredump_filter", s->coredump, sizeof s->coredump);
}

/* What differs between two states (NULL: nothing). */
static const char *init_state_change(const struct init_state *a, const struct init_state *b) {
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        if (a->limits_ok[r] != b->limits_ok[r] ||
            a->limits[r].rlim_cur != b->limits[r].rlim_cur ||
            a->limits[r].rlim_max != b->limits[r].rlim_max)
            return "its resource limits";
    }
    if (a->nice != b->nice)
        return "its nice value";
    if (a->cpus_ok != b->cpus_ok || (a->cpus_ok && !CPU_EQUAL(&a->cpus, &b->cpus)))
        return "its CPU affinity";
    if (a->attr_ok != b->attr_ok || memcmp(a->attr, b->attr, sizeof a->attr) != 0)
        return "its scheduling attributes";
    if (a->ioprio != b->ioprio)
        return "its I/O priority";
    if (a->timerslack != b->timerslack)
        return "its timer slack";
    if (strcmp(a->oom, b->oom) != 0)
        return "its OOM score adjustment";
    if (strcmp(a->coredump, b->coredump) != 0)
        return "its core dump filter";
    return NULL;
}

static struct init_state serve_initial;

/* Kill everything in the namespace but us, and reap it all. */
static void serve_sweep(void) {
    for (;;) {
        if (kill(-1, SIGKILL) < 0 && errno == ESRCH)
            return; /* nothing left: from pid 1, -1 is every other process of the namespace */
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
        }
    }
}

static pid_t serve_spawn(char *msg, size_t len, const int fds[CX_SERVE_FDS], const sigset_t *old) {
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
    struct init_state now;
    init_state_read(&now);
    const char *changed = init_state_change(&serve_initial, &now);
    if (changed != NULL) {
        char text[160];
        snprintf(text, sizeof text, "a command changed %s (inherited by every command)", changed);
        serve_fail("init-changed", EPERM, text);
        return -1;
    }
    pid_t child = fork();
    if (child < 0) {
        serve_fail("fork", errno, strerror(errno));
        return -1;
    }
    if (child == 0)
        serve_exec(cwd, args, envp, fds, old);
    return child;
}

void cx_serve_main(void) {
    static char msg[SERVE_MAX];
    sigset_t old = cx_init_old_mask;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        cx_fail("init", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    int sigfd = signalfd(-1, &cx_init_set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0)
        cx_fail("init", errno, "signalfd: %s", strerror(errno));
    /* hold nothing of the first command's stdio; keep status (3), control (4), signals (5) */
    int keep[3] = {cx_status_fd, cx_serve_fd, sigfd};
    int moved[3];
    for (int k = 0; k < 3; k++) {
        moved[k] = fcntl(keep[k], F_DUPFD_CLOEXEC, 10);
        if (moved[k] < 0)
            cx_fail("init", errno, "fcntl: %s", strerror(errno));
    }
    for (int fd = 0; fd < 3; fd++)
        close(fd); /* (received fds may land here: serve_exec moves them first) */
    for (int k = 0; k < 3; k++) {
        if (dup3(moved[k], 3 + k, O_CLOEXEC) < 0)
            _exit(125);
    }
    cx_status_fd = 3;
    cx_serve_fd = 4;
    sigfd = 5;
    syscall(__NR_close_range, 6U, ~0U, 0U);
    init_state_read(&serve_initial); /* what every command inherits, before the first */
    pid_t child = 0;
    for (;;) {
        struct pollfd polls[2] = {{.fd = cx_serve_fd, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
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
        char cbuf[CMSG_SPACE(CX_SERVE_FDS * sizeof(int))];
        struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        ssize_t len = recvmsg(cx_serve_fd, &mh, MSG_CMSG_CLOEXEC);
        if (len < 0 && errno == EINTR)
            continue;
        if (len <= 0)
            _exit(0); /* corral closed the session (or went away): the namespace ends */
        int fds[CX_SERVE_FDS] = {-1, -1, -1, -1, -1, -1};
        int nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int k = 0; k < got; k++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
                    if (nfds < CX_SERVE_FDS)
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
            else if (nfds < 3)
                serve_fail("parse-request", EINVAL, "a command needs 3 fds (and at most 6)");
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
