/*
 * exec/identity.c: corral-exec --as-user, the stage before bubblewrap that
 * sheds a root caller's identity: idmapped clones of the writable paths, the
 * staging of bind sources the unprivileged bubblewrap cannot reach, the drop
 * to the sandbox's uid.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"

#define MAX_STAGES 128
#define STAGE_DIR "/dev/shm"

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
        cx_fail("idmap", errno, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0)
        cx_fail("idmap", errno, "fork: %s", strerror(errno));
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
        cx_fail("idmap", EPERM, "the idmap helper could not enter a user namespace");
    char path[64], map[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        cx_fail("idmap", errno, "open %s: %s", path, strerror(errno));
    if (swap)
        snprintf(map, sizeof map, "0 %u 1\n%u 0 1\n", uid, uid);
    else
        snprintf(map, sizeof map, "0 %u 1\n", uid);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    cx_write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    cx_write_file(path, map);
    close(go[1]);
    waitpid(child, NULL, 0);
    return fd;
}

/* Clone the mount tree at PATH onto AT (idmapped with USERNS unless it is -1). */
static void clone_tree(const char *path, const char *at, int userns) {
    int tree = (int)syscall(__NR_open_tree, AT_FDCWD, path,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        cx_fail("idmap", errno, "open_tree %s: %s", path, strerror(errno));
    if (userns < 0)
        goto move;
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP;
    attr.userns_fd = (uint64_t)userns;
    if (syscall(__NR_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
        cx_fail("idmap", errno,
             "idmapped mount of %s: %s (the filesystem must support idmapped mounts; "
             "--allow-degraded isolation keeps the host's root identity instead)",
             path, strerror(errno));
move:
    if (syscall(__NR_move_mount, tree, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        cx_fail("idmap", errno, "move_mount %s: %s", at, strerror(errno));
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
        cx_fail("stage", errno, "%s: %s (a bind source the sandbox cannot reach is staged by root "
             "and must have no symbolic link on its way)", path, strerror(errno));
    if (fstat(fd, &st) < 0)
        cx_fail("stage", errno, "%s: %s", path, strerror(errno));
    *is_dir = S_ISDIR(st.st_mode);
    int tree = (int)syscall(__NR_open_tree, fd, "",
                            AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        cx_fail("stage", errno, "open_tree %s: %s", path, strerror(errno));
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
        cx_fail("stage", EPERM, "could not return to root's filesystem ids");
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

int cx_as_user_main(int argc, char **argv) {
    if (argc < 3)
        cx_usage();
    unsigned uid = (unsigned)cx_parse_long(argv[2], "--as-user");
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
            cx_usage();
        if (strcmp(argv[i], "--status-fd") == 0)
            cx_status_fd = (int)cx_parse_long(argv[++i], "--status-fd");
        else if (strcmp(argv[i], "--idmap") == 0) {
            if (npaths == MAX_KEEP)
                cx_fail("parse-arguments", E2BIG, "too many --idmap");
            paths[npaths++] = argv[++i];
        } else if (strcmp(argv[i], "--stage") == 0) {
            if (nstages == MAX_STAGES)
                cx_fail("parse-arguments", E2BIG, "too many --stage");
            stages[nstages++] = argv[++i];
        } else if (strcmp(argv[i], "--overlay") == 0) {
            if (i + 3 >= argc)
                cx_usage();
            for (int k = 0; k < 3; k++) {
                overlay[k] = argv[++i];
                if (overlay[k][0] != '/')
                    cx_fail("parse-arguments", EINVAL, "overlay directories must be absolute paths");
            }
        } else
            cx_fail("parse-arguments", EINVAL, "unknown option %s", argv[i]);
    }
    if (i >= argc || argv[i][0] != '/')
        cx_fail("parse-arguments", EINVAL, "--as-user needs an absolute program path after --");
    if (uid == 0)
        cx_fail("parse-arguments", EINVAL, "--as-user needs a uid other than 0");
    if (geteuid() != 0)
        cx_fail("as-user", EPERM, "--as-user is for a root caller");
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
        cx_fail("as-user", EINVAL, "--overlay needs the host's root and --idmap paths for its layers");
    if (npaths > 0 || nstages > 0) {
        if (unshare(CLONE_NEWNS) < 0)
            cx_fail("enter-mount-namespace", errno, "unshare: %s", strerror(errno));
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            cx_fail("make-mounts-private", errno, "%s", strerror(errno));
        int userns = npaths > 0 ? idmap_userns(uid, overlay[0] != NULL || keep_root) : -1;
        for (int k = 0; k < npaths; k++) {
            if (paths[k][0] != '/')
                cx_fail("parse-arguments", EINVAL, "--idmap needs an absolute path: %s", paths[k]);
            clone_tree(paths[k], paths[k], userns);
        }
        if (overlay[0] != NULL)
            cx_mount_kernel_overlay(overlay[0], overlay[1], overlay[2], 0);
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
                cx_fail("as-user", errno, "drop supplementary groups: %s", strerror(errno));
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
                cx_fail("stage", EINVAL, "%s: not an absolute path", stages[k]);
            trees[k] = clone_staged(stages[k], &is_dir[k]);
            staged++;
        }
        if (staged > 0 && mount("tmpfs", STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                "mode=0755") < 0)
            cx_fail("stage", errno, "tmpfs on %s: %s", STAGE_DIR, strerror(errno));
        for (int k = 0; k < nstages; k++) {
            char at[64];
            if (trees[k] < 0)
                continue;
            snprintf(at, sizeof at, STAGE_DIR "/%d", k);
            int made = is_dir[k] ? mkdir(at, 0755) : mknod(at, S_IFREG | 0644, 0);
            if (made < 0)
                cx_fail("stage", errno, "%s: %s", at, strerror(errno));
            if (syscall(__NR_move_mount, trees[k], "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                cx_fail("stage", errno, "move_mount %s: %s", at, strerror(errno));
            close(trees[k]);
        }
        if (userns >= 0)
            close(userns);
    }
    if (!host_root || keep_root) {
        execv(argv[i], argv + i);
        cx_fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    }
    if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
        cx_fail("as-user", errno, "switch to uid %u: %s", uid, strerror(errno));
    if (geteuid() == 0 || getegid() == 0)
        cx_fail("as-user", EPERM, "still root after the switch to uid %u", uid);
    execv(argv[i], argv + i);
    cx_fail("exec-sandbox", errno, "%s: %s", argv[i], strerror(errno));
    return 125;
}

