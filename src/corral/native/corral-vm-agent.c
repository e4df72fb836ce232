/*
 * corral-vm-agent: pid 1 of a corral micro-VM guest (backend "microvm").
 *
 *   corral-vm-agent DEVICE
 *   corral-vm-agent vsock:CID:PORT
 *
 * The guest's init script (corral/images/_vm.py, INIT) mounts the read-only
 * root with a writable overlay, then execs this program as pid 1 with the
 * transport the kernel command line selected: DEVICE, the virtio-serial
 * port the host talks on (qemu), or vsock:CID:PORT, a virtio-vsock stream
 * this program connects to (Firecracker: CID 2, the host, which relays the
 * connection to its unix socket <uds_path>_PORT). Nothing else in the guest
 * listens to the host.
 *
 * Protocol: frames of  type (1 byte) | length (4 bytes, big endian) | payload.
 *
 *   host -> guest
 *     'E'  run a command; payload: NUL-terminated fields
 *          cwd, uid, gid, timeout_ms (0: none), grace_ms, output cap (0: none),
 *          pids max (0: none), memory max (0: none), argc, argv..., envc, env...
 *     'I'  stdin bytes            'i'  stdin closed
 *     'S'  deliver signal payload[0] to the command's process group
 *     'T'  stop: SIGTERM to every process of the command, SIGKILL after grace
 *     'K'  SIGKILL every process of the command now
 *     'M'  show the workspace at PATH: the virtiofs share TAG's directory "ws"
 *          (where the host mounted this run's view); payload: TAG, PATH, "ro" or
 *          "rw" (NUL-terminated; answered by 'm' with an empty payload or the error)
 *     'Q'  power the VM off
 *   guest -> host
 *     'R'  ready; payload: the guest kernel's release
 *     '1'  stdout bytes           '2'  stderr bytes
 *     'X'  the command ended; payload "exit N" or "signal N", then a NUL and
 *          the reason corral stopped it ("", "timeout", "output", "stopped")
 *     'F'  a command could not be started; payload: the error text
 *
 * One command at a time. Every process of a command lives in the cgroup
 * /sys/fs/cgroup/corral-cmd (pids.max and memory.max as asked); when the
 * command's first process exits, every other process of the guest is killed
 * (kill(-1, SIGKILL) from pid 1), as a pid namespace dies with its first
 * process on the other backends. The
 * timeout and the output cap are enforced here, inside the guest, as well as
 * by corral on the host.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/sched.h>
#include <linux/vm_sockets.h>

#define CGROUP "/sys/fs/cgroup/corral-cmd"
#define MAX_FRAME (1u << 20)

static int chan = -1;

static void die(const char *what) {
    dprintf(2, "corral-vm-agent: %s: %s\n", what, strerror(errno));
    sync();
    reboot(RB_POWER_OFF);
    _exit(1);
}

static void write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd w = {fd, POLLOUT, 0};
                poll(&w, 1, 1000);
                continue;
            }
            die("write to the host");
        }
        p += n;
        len -= (size_t)n;
    }
}

static void send_frame(char type, const void *data, uint32_t len) {
    unsigned char head[5] = {(unsigned char)type, (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                             (unsigned char)(len >> 8), (unsigned char)len};
    write_all(chan, head, sizeof head);
    if (len)
        write_all(chan, data, len);
}

/* Blocking read of exactly len bytes from the channel; 0 on end of file. */
static int read_exact(void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(chan, p, len);
        if (n == 0)
            return 0;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd r = {chan, POLLIN, 0};
                poll(&r, 1, -1);
                continue;
            }
            die("read from the host");
        }
        p += n;
        len -= (size_t)n;
    }
    return 1;
}

/* Next frame; returns its type, or 0 when the host went away. *data is malloc'd. */
static char read_frame(char **data, uint32_t *len) {
    unsigned char head[5];
    if (!read_exact(head, sizeof head))
        return 0;
    *len = ((uint32_t)head[1] << 24) | ((uint32_t)head[2] << 16) | ((uint32_t)head[3] << 8) | head[4];
    if (*len > MAX_FRAME) {
        errno = EMSGSIZE;
        die("frame from the host");
    }
    *data = malloc(*len + 1);
    if (*data == NULL)
        die("malloc");
    if (*len && !read_exact(*data, *len))
        return 0;
    (*data)[*len] = 0;
    return (char)head[0];
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t r = write(fd, text, strlen(text));
    (void)r;
    close(fd);
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Signal every process of the command. As pid 1, kill(-1) reaches every other process of
 * the guest (a process that left the cgroup or its session included); the agent runs
 * one command at a time, so that is exactly the command's tree. */
static void signal_all(int sig) {
    kill(-1, sig);
}

struct command {
    pid_t pid;
    int in, out, err; /* our ends; -1 once closed */
    long long deadline, kill_at;
    unsigned long long cap, sent;
    int done, status;
    const char *reason;
};

static void start_stop(struct command *c, const char *reason, long long grace_ms) {
    if (c->kill_at)
        return;
    if (c->reason[0] == 0)
        c->reason = reason;
    signal_all(SIGTERM);
    signal_all(SIGCONT);
    c->kill_at = now_ms() + grace_ms;
}

static void forward(struct command *c, int *fd, char type) {
    char buf[65536];
    ssize_t n = read(*fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close(*fd);
        *fd = -1;
        return;
    }
    size_t keep = (size_t)n;
    if (c->cap && c->sent + keep > c->cap) {
        keep = (size_t)(c->cap - c->sent);
        if (c->reason[0] == 0)
            c->reason = "output";
        signal_all(SIGKILL);
    }
    if (keep)
        send_frame(type, buf, (uint32_t)keep);
    c->sent += keep;
}

static char **fields(char **p, char *end, long count) {
    char **out = calloc((size_t)count + 1, sizeof *out);
    if (out == NULL)
        die("calloc");
    for (long i = 0; i < count; i++) {
        if (*p >= end) {
            errno = EINVAL;
            die("exec frame");
        }
        out[i] = *p;
        *p += strlen(*p) + 1;
    }
    return out;
}

/* fork() the command's first process straight into the command cgroup (clone3 with
 * CLONE_INTO_CGROUP; *joined = 1): moving a process into a cgroup afterwards (a write to
 * cgroup.procs) takes the cgroup threadgroup lock for writing, which waits for an RCU grace
 * period - several milliseconds of an emulated (TCG) guest's time on most commands. Where
 * clone3 or the flag is missing, a plain fork(); the child then joins the cgroup itself. */
static pid_t spawn_in_cgroup(int *joined) {
    int group = open(CGROUP, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (group >= 0) {
        struct clone_args args;
        memset(&args, 0, sizeof args);
        args.flags = CLONE_INTO_CGROUP;
        args.exit_signal = SIGCHLD;
        args.cgroup = (uint64_t)group;
        long pid = syscall(SYS_clone3, &args, sizeof args);
        if (pid >= 0) {
            if (pid > 0)
                close(group);
            *joined = 1;
            return (pid_t)pid;
        }
        close(group);
    }
    *joined = 0;
    return fork();
}

static void run_command(char *data, uint32_t len, int sfd) {
    char *p = data, *end = data + len;
    char *f[9];
    for (int i = 0; i < 9; i++) {
        if (p >= end) {
            send_frame('F', "malformed exec frame", 20);
            return;
        }
        f[i] = p;
        p += strlen(p) + 1;
    }
    const char *cwd = f[0];
    uid_t uid = (uid_t)strtoul(f[1], NULL, 10);
    gid_t gid = (gid_t)strtoul(f[2], NULL, 10);
    long long timeout = strtoll(f[3], NULL, 10), grace = strtoll(f[4], NULL, 10);
    unsigned long long cap = strtoull(f[5], NULL, 10);
    const char *pids = f[6], *memory = f[7];
    long argc = strtol(f[8], NULL, 10);
    char **argv = fields(&p, end, argc);
    long envc = p < end ? strtol(p, NULL, 10) : 0;
    if (p < end)
        p += strlen(p) + 1;
    char **envp = fields(&p, end, envc);

    mkdir(CGROUP, 0755);
    write_file(CGROUP "/pids.max", strcmp(pids, "0") ? pids : "max");
    write_file(CGROUP "/memory.max", strcmp(memory, "0") ? memory : "max");

    int in[2], out[2], err[2], ready[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(ready, O_CLOEXEC))
        die("pipe");
    int joined = 0;
    pid_t pid = spawn_in_cgroup(&joined);
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        if (!joined) {
            char me[32];
            snprintf(me, sizeof me, "%d", (int)getpid());
            write_file(CGROUP "/cgroup.procs", me);
        }
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        const char *step = "chdir";
        if (chdir(cwd) == 0) {
            step = "drop privileges";
            if ((uid == 0 || (setgroups(0, NULL) == 0 && setgid(gid) == 0 && setuid(uid) == 0))) {
                /* PATH lookup in the command's own PATH */
                for (char **e = envp; *e; e++)
                    if (strncmp(*e, "PATH=", 5) == 0)
                        setenv("PATH", *e + 5, 1);
                step = "exec";
                execvpe(argv[0], argv, envp);
            }
        }
        char msg[512];
        int n = snprintf(msg, sizeof msg, "%s %s: %s", step, step[0] == 'c' ? cwd : argv[0], strerror(errno));
        ssize_t w = write(ready[1], msg, (size_t)n);
        (void)w;
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    close(ready[1]);
    char msg[512];
    ssize_t n = read(ready[0], msg, sizeof msg);
    close(ready[0]);
    free(argv);
    free(envp);
    if (n > 0) {
        waitpid(pid, NULL, 0);
        close(in[1]);
        close(out[0]);
        close(err[0]);
        send_frame('F', msg, (uint32_t)n);
        return;
    }
    struct command c = {pid, in[1], out[0], err[0], timeout ? now_ms() + timeout : 0, 0, cap, 0, 0, 0, ""};
    fcntl(c.out, F_SETFL, O_NONBLOCK);
    fcntl(c.err, F_SETFL, O_NONBLOCK);
    while (!c.done || c.out >= 0 || c.err >= 0) {
        struct pollfd fds[4] = {{chan, POLLIN, 0}, {sfd, POLLIN, 0}, {c.out, POLLIN, 0}, {c.err, POLLIN, 0}};
        long long t = now_ms(), wait = -1;
        if (c.deadline && !c.kill_at)
            wait = c.deadline > t ? c.deadline - t : 0;
        if (c.kill_at)
            wait = c.kill_at > t ? c.kill_at - t : 0;
        if (c.done)
            wait = wait < 0 || wait > 50 ? 50 : wait;
        poll(fds, 4, (int)wait);
        t = now_ms();
        if (c.deadline && t >= c.deadline && !c.done)
            start_stop(&c, "timeout", grace);
        if (c.kill_at && t >= c.kill_at)
            signal_all(SIGKILL);
        if (fds[2].revents)
            forward(&c, &c.out, '1');
        if (fds[3].revents)
            forward(&c, &c.err, '2');
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            ssize_t r = read(sfd, &si, sizeof si);
            (void)r;
            int status;
            pid_t dead;
            while ((dead = waitpid(-1, &status, WNOHANG)) > 0)
                if (dead == c.pid && !c.done) {
                    c.done = 1;
                    c.status = status;
                    signal_all(SIGKILL); /* the rest of the tree dies with its first process */
                }
        }
        if (fds[0].revents) {
            char *data = NULL;
            uint32_t dlen = 0;
            char type = read_frame(&data, &dlen);
            if (type == 0) {
                signal_all(SIGKILL);
                sync();
                reboot(RB_POWER_OFF);
            } else if (type == 'I' && c.in >= 0) {
                write_all(c.in, data, dlen);
            } else if (type == 'i' && c.in >= 0) {
                close(c.in);
                c.in = -1;
            } else if (type == 'S' && dlen == 1) {
                kill(-c.pid, (unsigned char)data[0]);
            } else if (type == 'T') {
                start_stop(&c, "stopped", grace);
            } else if (type == 'K') {
                if (c.reason[0] == 0)
                    c.reason = "stopped";
                signal_all(SIGKILL);
            } else if (type == 'Q') {
                signal_all(SIGKILL);
                sync();
                reboot(RB_POWER_OFF);
            }
            free(data);
        }
    }
    if (c.in >= 0)
        close(c.in);
    char result[64];
    int rl;
    if (WIFSIGNALED(c.status))
        rl = snprintf(result, sizeof result, "signal %d", WTERMSIG(c.status));
    else
        rl = snprintf(result, sizeof result, "exit %d", WEXITSTATUS(c.status));
    rl += 1 + snprintf(result + rl + 1, sizeof result - (size_t)rl - 1, "%s", c.reason);
    send_frame('X', result, (uint32_t)rl);
}

/* mkdir -p PATH (mode 755) */
static void make_dirs(char *path) {
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    mkdir(path, 0755);
}

/* The share (virtiofs TAG) is mounted once at /.corral/share; its "ws" directory, where
 * the host put this run's view of the workspace, is bound at PATH (read-only if asked). */
static void mount_share(char *data, uint32_t len) {
    char *tag = data, *path = NULL, *mode = NULL, *end = data + len;
    if (tag < end)
        path = tag + strlen(tag) + 1;
    if (path && path < end)
        mode = path + strlen(path) + 1;
    if (mode == NULL || mode >= end || path[0] != '/') {
        send_frame('m', "malformed mount frame", 21);
        return;
    }
    char msg[512];
    int n = 0;
    struct stat st;
    mkdir("/.corral/share", 0700);
    if (stat("/.corral/share/ws", &st) != 0 &&
        mount(tag, "/.corral/share", "virtiofs", MS_NOSUID | MS_NODEV, NULL) < 0)
        n = snprintf(msg, sizeof msg, "mount virtiofs %s: %s", tag, strerror(errno));
    if (n == 0) {
        make_dirs(path);
        if (mount("/.corral/share/ws", path, NULL, MS_BIND, NULL) < 0)
            n = snprintf(msg, sizeof msg, "bind the workspace on %s: %s", path, strerror(errno));
        else if (strcmp(mode, "ro") == 0 &&
                 mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
            n = snprintf(msg, sizeof msg, "make %s read-only: %s", path, strerror(errno));
    }
    send_frame('m', msg, (uint32_t)(n > 0 ? n : 0));
}

/* The channel to the host: "vsock:CID:PORT" connects (retrying while the transport
 * or the host's listener comes up, for 10 s at most); anything else is a device path
 * opened read-write. */
static int open_channel(const char *spec) {
    unsigned cid, port;
    char end;
    if (strncmp(spec, "vsock:", 6) != 0)
        return open(spec, O_RDWR | O_CLOEXEC);
    if (sscanf(spec + 6, "%u:%u%c", &cid, &port, &end) != 2) {
        errno = EINVAL;
        return -1;
    }
    struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port};
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += 10;
    for (;;) {
        int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
            return fd;
        int saved = errno;
        close(fd);
        errno = saved;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec) ||
            (errno != ECONNREFUSED && errno != ECONNRESET && errno != ENODEV &&
                              errno != ETIMEDOUT && errno != EINTR))
            return -1;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        dprintf(2, "usage: corral-vm-agent DEVICE|vsock:CID:PORT\n");
        return 2;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        die("signalfd");
    chan = open_channel(argv[1]);
    if (chan < 0)
        die(argv[1]);
    write_file("/sys/fs/cgroup/cgroup.subtree_control", "+pids +memory");
    struct utsname u;
    uname(&u);
    send_frame('R', u.release, (uint32_t)strlen(u.release));
    for (;;) {
        char *data = NULL;
        uint32_t len = 0;
        char type = read_frame(&data, &len);
        if (type == 0 || type == 'Q')
            break;
        if (type == 'E')
            run_command(data, len, sfd);
        else if (type == 'M')
            mount_share(data, len);
        /* reap whatever is left (pid 1's duty) */
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        free(data);
    }
    signal_all(SIGKILL);
    sync();
    reboot(RB_POWER_OFF);
    return 0;
}
