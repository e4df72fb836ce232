/*
 * client/fallback.c: falling back to corral's Python command line - the
 * interpreter the sidecar names, the handoff of what this program learned, the
 * hook's input on a memfd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"

/* ---------------------------------------------------------------- falling back */
static const char *const result_names[] = {"", "no-server", "stale", "refused"};
struct pending cl_pending;
const struct buf *cl_hook_input; /* the hook's input, once it was read */

/* exec corral's Python CLI with our arguments; never returns. */
void cl_exec_python(char **argv, enum result result) {
    static const char hint[] =
        "run 'corral server --detach' (or 'corral install claude-code') once with this "
        "installation's corral to record its interpreter, or use 'corral' instead of corral-client";
    /* 1. Signals: from here on a forwarded signal has the action it had when
     *    we started; the ones that arrived so far travel in the handoff. */
    cl_restore_signals();
    cl_drain_signals(&cl_pending);

    /* 2. The sidecar next to this executable names the interpreter. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 8);
    if (n < 0)
        cl_die(hint, "cannot fall back to corral's Python command line: /proc/self/exe: %s",
            strerror(errno));
    exe[n] = 0;
    char sidecar[PATH_MAX + 8];
    snprintf(sidecar, sizeof sidecar, "%s.cli", exe);
    struct stat self, st;
    int fd = open(sidecar, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        cl_die(hint, "cannot fall back to corral's Python command line: %s: %s", sidecar,
            strerror(errno));
    if (stat("/proc/self/exe", &self) < 0 || fstat(fd, &st) < 0)
        cl_die(hint, "cannot fall back to corral's Python command line: stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode) || (st.st_mode & 022) || (st.st_uid != self.st_uid && st.st_uid != 0))
        cl_die(hint,
            "cannot fall back to corral's Python command line: %s must be a regular file owned "
            "by uid %u (or root) and writable by its owner only",
            sidecar, (unsigned)self.st_uid);
    char interpreter[MAX_SIDECAR + 1];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, interpreter + got, MAX_SIDECAR - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            cl_die(hint, "cannot fall back to corral's Python command line: %s: %s", sidecar,
                strerror(errno));
        if (r == 0 || (got += (size_t)r) == MAX_SIDECAR)
            break;
    }
    close(fd);
    interpreter[got] = 0;
    if (got && interpreter[got - 1] == '\n')
        interpreter[--got] = 0;
    if (got == 0 || got >= MAX_SIDECAR - 1 || interpreter[0] != '/' ||
        strlen(interpreter) != got || strchr(interpreter, '\n'))
        cl_die(hint,
            "cannot fall back to corral's Python command line: %s does not hold one absolute "
            "interpreter path",
            sidecar);

    /* 3. argv: the interpreter, then our arguments as the corral command's. */
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (!args)
        cl_die(NULL, "out of memory");
    args[0] = interpreter;
    args[1] = "-P"; /* never import from the current directory */
    args[2] = "-c";
    args[3] = BOOTSTRAP;
    for (int i = 1; i < argc; i++)
        args[3 + i] = argv[i];

    /* 4. The environment, with what we learned in CORRAL_HANDOFF. */
    char **envp = environ;
    if (result != R_NONE) {
        static char handoff[sizeof HANDOFF + 16 + MAX_PENDING * 4];
        size_t len = (size_t)snprintf(handoff, sizeof handoff, "%s=%s", HANDOFF,
                                      result_names[result]);
        for (int i = 0; i < cl_pending.count && len + 8 < sizeof handoff; i++)
            len += (size_t)snprintf(handoff + len, sizeof handoff - len, "%c%d", i ? ',' : ':',
                                    cl_pending.sig[i]);
        size_t count = 0;
        while (environ[count])
            count++;
        envp = calloc(count + 2, sizeof *envp);
        if (!envp)
            cl_die(NULL, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < count; i++)
            if (strncmp(environ[i], HANDOFF "=", sizeof HANDOFF) != 0)
                envp[k++] = environ[i];
        envp[k++] = handoff;
    }

    /* 5. The hook's input, if we read it: a memfd with exactly those bytes
     *    becomes the Python CLI's stdin. */
    if (cl_hook_input) {
        int mfd = memfd_create("corral-hook-input", MFD_CLOEXEC);
        if (mfd < 0 || cl_write_fully(mfd, cl_hook_input->data, cl_hook_input->len) < 0 ||
            lseek(mfd, 0, SEEK_SET) < 0 || dup2(mfd, 0) < 0)
            cl_die(NULL, "the hook failed (cannot hand its input on: %s); the tool call is blocked",
                strerror(errno));
        close(mfd);
    }
    execve(interpreter, args, envp);
    cl_die(hint, "cannot start corral's Python command line (%s): %s", interpreter, strerror(errno));
}
