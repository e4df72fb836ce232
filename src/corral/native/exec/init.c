/*
 * exec/init.c: the helper as the parent of the command - the sandbox's pid 1
 * (--init), the reaper of a sandbox without a pid namespace (--reaper), and
 * the pid 1 of a session container (--hold).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"

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
 * instead (cx_serve_main).
 */
const int cx_forwarded_signals[] = {SIGHUP,  SIGINT,   SIGQUIT, SIGTERM, SIGUSR1,
                                  SIGUSR2, SIGWINCH, SIGCONT, SIGALRM};
const size_t cx_nforwarded_signals = sizeof cx_forwarded_signals / sizeof cx_forwarded_signals[0];

static void note_signal(int sig) {
    (void)sig; /* never runs: the signals are blocked and taken by sigwaitinfo */
}

sigset_t cx_init_set, cx_init_old_mask;

/* Exit as the command ended (WSTATUS from waitpid): its status, or 128 + the signal that
 * killed it, which is also named on the status fd ("S<n>"). */
static void exit_as(int wstatus) __attribute__((noreturn));
static void exit_as(int wstatus) {
    if (WIFSIGNALED(wstatus)) {
        char line[16];
        int n = snprintf(line, sizeof line, "S%d\n", WTERMSIG(wstatus));
        cx_status_write(line, (size_t)n);
        _exit(128 + WTERMSIG(wstatus));
    }
    _exit(WEXITSTATUS(wstatus));
}

/* As early as possible: pid 1 gets only signals it handles, so handle (and
 * block) the ones corral forwards; one sent before the command exists then
 * waits for it. */
void cx_init_take_signals(void) {
    if (getpid() != 1)
        cx_fail("init", EINVAL, "--init needs to be pid 1 of a new pid namespace (bwrap --as-pid-1)");
    sigemptyset(&cx_init_set);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal;
    for (size_t k = 0; k < sizeof cx_forwarded_signals / sizeof cx_forwarded_signals[0]; k++) {
        sigaddset(&cx_init_set, cx_forwarded_signals[k]);
        sigaction(cx_forwarded_signals[k], &sa, NULL);
    }
    sigaddset(&cx_init_set, SIGCHLD);
    sigaction(SIGCHLD, &sa, NULL);
    if (sigprocmask(SIG_BLOCK, &cx_init_set, &cx_init_old_mask) < 0)
        cx_fail("init", errno, "sigprocmask: %s", strerror(errno));
}

void cx_run_as_init(void) {
    sigset_t set = cx_init_set, old = cx_init_old_mask;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    pid_t child = fork();
    if (child < 0)
        cx_fail("init", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        sa.sa_handler = SIG_DFL;
        for (size_t k = 0; k < sizeof cx_forwarded_signals / sizeof cx_forwarded_signals[0]; k++)
            sigaction(cx_forwarded_signals[k], &sa, NULL);
        sigaction(SIGCHLD, &sa, NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (setsid() < 0)
            cx_fail("setsid", errno, "%s", strerror(errno));
        if (cx_want_ctty_global && ioctl(0, TIOCSCTTY, 0) < 0)
            cx_fail("set-controlling-terminal", errno, "%s", strerror(errno));
        return; /* the caller marks fds close-on-exec and execs the command */
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        cx_fail("init", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    /* hold nothing of the command's: stdio, the pty, kept fds, pipes */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (cx_status_fd >= 0 && cx_status_fd != 3) {
        if (dup2(cx_status_fd, 3) < 0)
            _exit(125);
        cx_status_fd = 3;
    }
    syscall(__NR_close_range, cx_status_fd >= 0 ? 4U : 3U, ~0U, 0U);
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
            exit_as(wstatus);
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

void cx_run_as_reaper(void) {
    sigset_t all, old;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal; /* SIGCHLD must not be discarded as "ignored" */
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(cx_reap_signal, &sa, NULL); /* taken by sigwaitinfo, even if inherited as ignored */
    sigfillset(&all);
    if (sigprocmask(SIG_BLOCK, &all, &old) < 0)
        cx_fail("reaper", errno, "sigprocmask: %s", strerror(errno));
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        cx_fail("reaper", errno, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    pid_t self = getpid();
    pid_t child = fork();
    if (child < 0)
        cx_fail("reaper", errno, "fork: %s", strerror(errno));
    if (child == 0) {
        sa.sa_handler = SIG_DFL;
        sigaction(SIGCHLD, &sa, NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != self)
            cx_fail("reaper", errno, "the helper went away before the command started");
        return; /* the caller applies Landlock and seccomp and execs the command */
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
        kill(child, SIGKILL);
        cx_fail("reaper", errno, "PR_SET_DUMPABLE: %s", strerror(errno));
    }
    /* hold nothing of the command's: stdio, the pty, kept fds, pipes */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (cx_status_fd >= 0 && cx_status_fd != 3) {
        if (dup2(cx_status_fd, 3) < 0) {
            kill(child, SIGKILL);
            _exit(125);
        }
        cx_status_fd = 3;
    }
    syscall(__NR_close_range, cx_status_fd >= 0 ? 4U : 3U, ~0U, 0U);
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
        } else if (sig != cx_reap_signal) {
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
    exit_as(command_status);
}

/*
 * --hold: the pid 1 of a session container (podman), in place of catatonit
 * and ``sleep infinity``. Each command of the session is started by the engine
 * (``podman exec``) under this helper's main mode, with corral's filters; this
 * process only reaps the orphans they leave, and it is not dumpable, so no
 * command can write into its memory or trace it. SIGTERM or SIGINT end it (and
 * with it the container).
 */
int cx_hold_main(void) {
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
