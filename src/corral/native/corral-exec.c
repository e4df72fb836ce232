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
 *       process the command started when it ends (see cx_run_as_reaper)
 *   5. Landlock ruleset                                 (when asked)
 *   6. seccomp deny filter(s)                           (when asked)
 *   7. seccomp user-notification filter, whose listener fd is sent to corral's
 *      write broker over a unix socket                  (when asked)
 *   7b. with --init (bubblewrap's --as-pid-1): fork; this process stays the
 *       sandbox's pid 1 and reaper, the child goes on (see cx_run_as_init);
 *       with --serve FD as well, it runs no command of its own but spawns
 *       each command a resident session sends on FD (see cx_serve_main)
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
 * cx_mount_overlay_main() in exec/preview.c and docs/preview.md.
 *
 * SAFETY: this runs with the sandbox's credentials, after bubblewrap dropped
 * capabilities. Nothing here trusts the command; the order above matters:
 * no_new_privs must precede Landlock and seccomp (required by the kernel for
 * unprivileged callers), and the notification filter is installed last so
 * the helper's own remaining syscalls (sendmsg, close, execve) are not
 * trapped.
 *
 * Layout: this file holds main() (the main mode's steps, in the order above)
 * and the usage; exec/ holds the rest, one concern a file (exec/helper.h
 * declares what they share, every such name starting with cx_):
 *   exec/common.c    the status fd, failures, parsing, and the restriction
 *                    steps: seccomp, Landlock, rlimits, close-on-exec,
 *                    capabilities
 *   exec/preview.c   --mount-overlay
 *   exec/identity.c  --as-user
 *   exec/init.c      --init, --reaper, --hold
 *   exec/serve.c     --init --serve FD
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "exec/helper.h"

#define MAX_FILTERS 8
#define MAX_RLIMITS 16

int cx_want_ctty_global = 0; /* --ctty, for the init's child */
int cx_serve_fd = -1;        /* --serve: a resident session's control socket */
int cx_reap_signal = 0;      /* --reaper SIG: stay the command's parent; SIG kills the tree */
static int want_init = 0;    /* --init: stay pid 1, the command is our child */

void cx_usage(void) {
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
        return cx_mount_overlay_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--as-user") == 0)
        return cx_as_user_main(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--hold") == 0)
        return cx_hold_main();
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
            cx_status_fd = (int)cx_parse_long(argv[j + 1], "--status-fd");
            fcntl(cx_status_fd, F_SETFD, FD_CLOEXEC);
            break;
        }
    }
    cx_status_write("R\n", 2);

    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc && strcmp(a, "--setsid") != 0 && strcmp(a, "--ctty") != 0 &&
            strcmp(a, "--drop-caps") != 0 && strcmp(a, "--init") != 0)
            cx_usage();
        if (strcmp(a, "--status-fd") == 0) {
            i++;
        } else if (strcmp(a, "--seccomp-fd") == 0) {
            if (nseccomp == MAX_FILTERS)
                cx_fail("parse-arguments", E2BIG, "too many --seccomp-fd");
            seccomp_fds[nseccomp++] = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--seccomp-file") == 0) {
            /* an engine that cannot pass fds (docker) binds the program in read-only */
            if (nseccomp == MAX_FILTERS)
                cx_fail("parse-arguments", E2BIG, "too many --seccomp-fd");
            int fd = open(argv[++i], O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                cx_fail("install-seccomp-filter", errno, "%s: %s", argv[i], strerror(errno));
            seccomp_fds[nseccomp++] = fd;
        } else if (strcmp(a, "--notify-fd") == 0) {
            notify_fd = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--notify-sock") == 0) {
            notify_sock = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--wait-fd") == 0) {
            wait_fd = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--landlock-fd") == 0) {
            landlock_fd = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--keep-fd") == 0) {
            if (nkeep == MAX_KEEP)
                cx_fail("parse-arguments", E2BIG, "too many --keep-fd");
            keep[nkeep++] = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--chdir") == 0) {
            chdir_to = argv[++i];
        } else if (strcmp(a, "--setsid") == 0) {
            want_setsid = 1;
        } else if (strcmp(a, "--ctty") == 0) {
            want_ctty = cx_want_ctty_global = 1;
        } else if (strcmp(a, "--drop-caps") == 0) {
            want_drop_caps = 1;
        } else if (strcmp(a, "--init") == 0) {
            want_init = 1;
        } else if (strcmp(a, "--reaper") == 0) {
            cx_reap_signal = (int)cx_parse_long(argv[++i], a);
            if (cx_reap_signal < 1 || cx_reap_signal > SIGRTMAX || cx_reap_signal == SIGKILL ||
                cx_reap_signal == SIGSTOP || cx_reap_signal == SIGCHLD)
                cx_fail("parse-arguments", EINVAL, "bad --reaper signal %d", cx_reap_signal);
        } else if (strcmp(a, "--serve") == 0) {
            cx_serve_fd = (int)cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--die-with-parent") == 0) {
            parent_pid = cx_parse_long(argv[++i], a);
        } else if (strcmp(a, "--rlimit") == 0) {
            char spec[128];
            snprintf(spec, sizeof spec, "%s", argv[++i]);
            char *eq = strchr(spec, '=');
            char *colon = eq ? strchr(eq, ':') : NULL;
            if (!eq || !colon || nrlimits == MAX_RLIMITS)
                cx_fail("parse-arguments", EINVAL, "bad --rlimit %s", argv[i]);
            *eq = '\0';
            *colon = '\0';
            rlimits[nrlimits].res = cx_rlimit_resource(spec);
            rlimits[nrlimits].lim.rlim_cur = (rlim_t)strtoull(eq + 1, NULL, 10);
            rlimits[nrlimits].lim.rlim_max = (rlim_t)strtoull(colon + 1, NULL, 10);
            nrlimits++;
        } else {
            cx_fail("parse-arguments", EINVAL, "unknown option %s", a);
        }
    }
    if (i >= argc)
        cx_fail("parse-arguments", EINVAL, "no command given");
    if (want_init)
        cx_init_take_signals();
    if (cx_serve_fd >= 0 && !want_init)
        cx_fail("parse-arguments", EINVAL, "--serve needs --init");
    if (cx_reap_signal && want_init)
        cx_fail("parse-arguments", EINVAL, "--reaper and --init exclude each other");
    if ((notify_fd < 0) != (notify_sock < 0))
        cx_fail("parse-arguments", EINVAL, "--notify-fd and --notify-sock go together");

    /* 1b. corral may need to place us (e.g. into cgroups) before anything runs */
    if (wait_fd >= 0) {
        char byte;
        ssize_t n;
        do {
            n = read(wait_fd, &byte, 1);
        } while (n < 0 && errno == EINTR);
        if (n != 1)
            cx_fail("wait-for-corral", n < 0 ? errno : EPIPE, "corral went away before the start signal");
        close(wait_fd);
    }

    /* 2. session, lifetime, directory (as init, the session is the child's: 7b) */
    if (want_setsid && !want_init && setsid() < 0)
        cx_fail("setsid", errno, "%s", strerror(errno));
    if (want_ctty && !want_init) {
        /* An interactive shell on corral's private pty: become a session leader
         * (bubblewrap's init leads the sandbox's first session) and take the
         * pty on stdin as controlling terminal. TIOCSTI on it can only inject
         * input into this sandbox. */
        if (!want_setsid)
            (void)setsid();
        if (ioctl(0, TIOCSCTTY, 0) < 0)
            cx_fail("set-controlling-terminal", errno, "%s", strerror(errno));
    }
    if (parent_pid >= 0) {
        /* 0 means "whoever started us"; read it before arming the signal so a
         * parent that already died is noticed below. */
        if (parent_pid == 0)
            parent_pid = (long)getppid();
        /* a reaper takes its signal to end the command's tree first */
        if (prctl(PR_SET_PDEATHSIG, cx_reap_signal ? cx_reap_signal : SIGKILL, 0, 0, 0) < 0)
            cx_fail("set-parent-death-signal", errno, "%s", strerror(errno));
        /* The parent may have died before the prctl took effect. */
        if (getppid() != (pid_t)parent_pid)
            cx_fail("set-parent-death-signal", ESRCH, "parent %ld already exited", parent_pid);
    }
    if (chdir_to != NULL && chdir(chdir_to) < 0)
        cx_fail("chdir", errno, "%s: %s", chdir_to, strerror(errno));

    /* 3. resource limits */
    for (int k = 0; k < nrlimits; k++)
        if (setrlimit(rlimits[k].res, &rlimits[k].lim) < 0)
            cx_fail("setrlimit", errno, "resource %d: %s", rlimits[k].res, strerror(errno));

    /* 3b. capabilities (after setrlimit, which may need CAP_SYS_RESOURCE) */
    if (want_drop_caps)
        cx_drop_capabilities();

    /* 4. no_new_privs: required before Landlock/seccomp without CAP_SYS_ADMIN,
     * and it makes set-user-ID binaries inert for the rest of the tree. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        cx_fail("set-no-new-privs", errno, "%s", strerror(errno));

    /* 4b. the reaper stays outside the command's Landlock domain and seccomp filters */
    if (cx_reap_signal)
        cx_run_as_reaper();

    /* 5. Landlock */
    if (landlock_fd >= 0)
        cx_apply_landlock(landlock_fd);

    /* 6. seccomp deny filters, in the order given */
    for (int k = 0; k < nseccomp; k++)
        cx_install_filter(seccomp_fds[k], 0, "install-seccomp-filter");

    /* 7. the write-broker filter; its listener goes to corral */
    if (notify_fd >= 0) {
        int listener = cx_install_filter(notify_fd, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                                      "install-notify-filter");
        cx_send_fd(notify_sock, listener);
        close(listener);
        close(notify_sock);
    }

    /* 7b. as the sandbox's init: the command runs in a child; we stay pid 1 */
    if (cx_serve_fd >= 0)
        cx_serve_main();
    if (want_init)
        cx_run_as_init();

    /* 8. nothing but stdio and kept fds crosses into the command */
    cx_cloexec_all(keep, nkeep);

    /* 9. run the command */
    execvp(argv[i], argv + i);
    int err = errno;
    char line[600];
    int n = snprintf(line, sizeof line, "X%d\t%s\n", err, argv[i]);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (cx_status_fd >= 0)
        cx_status_write(line, (size_t)n);
    else
        fprintf(stderr, "corral-exec: %s: %s\n", argv[i], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}

