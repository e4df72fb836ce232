/*
 * client/server.c: where the corral server is and talking to it - the socket
 * path, the connection and its peer check, sending a request frame, reading
 * the answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"

/* ---------------------------------------------------------------- where the server is */
/* os.path.join(a, b) for a relative b. */
static int path_join(struct buf *b, const char *part) {
    if (b->len && b->data[b->len - 1] != '/' && cl_buf_putc(b, '/') < 0)
        return -1;
    return cl_buf_puts(b, part);
}

/* The socket path by the rule of corral._state.state_dir and _wire.socket_path;
 * 0, or -1 when $HOME is unset (Python then asks the user database: let it). */
int cl_socket_path(struct buf *path) {
    const char *xdg = getenv("XDG_STATE_HOME");
    if (xdg && *xdg) {
        if (cl_buf_puts(path, xdg) < 0)
            return -1;
    } else {
        const char *home = getenv("HOME");
        if (!home)
            return -1;
        /* HOME="" is os.path.expanduser("~") with an empty $HOME: "/" */
        if (cl_buf_puts(path, *home ? home : "/") < 0 || path_join(path, ".local") < 0 ||
            path_join(path, "state") < 0)
            return -1;
    }
    if (path_join(path, "corral") < 0 || path_join(path, "server") < 0 ||
        path_join(path, "server.sock") < 0 || cl_buf_putc(path, 0) < 0)
        return -1;
    path->len--;
    return 0;
}

/* ---------------------------------------------------------------- talking to the server */
/* connect() to the socket at path (NUL-terminated, len bytes); 0 or -1 with errno.
 * A path too long for sun_path goes through /proc/self/fd/N/NAME, N an O_PATH
 * descriptor of its directory, as _wire.connect_unix does. */
static int connect_path(int sock, const char *path, size_t len) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    int dirfd = -1;
    if (len < sizeof addr.sun_path) {
        memcpy(addr.sun_path, path, len);
    } else {
        const char *slash = strrchr(path, '/');
        if (!slash) {
            errno = ENAMETOOLONG;
            return -1;
        }
        char *directory = strndup(path, slash == path ? 1 : (size_t)(slash - path));
        if (!directory)
            return -1;
        dirfd = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC);
        free(directory);
        if (dirfd < 0)
            return -1;
        int n = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dirfd,
                         slash + 1);
        if (n < 0 || (size_t)n >= sizeof addr.sun_path) {
            close(dirfd);
            errno = ENAMETOOLONG;
            return -1;
        }
        len = (size_t)n;
    }
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    int rc;
    while ((rc = connect(sock, (struct sockaddr *)&addr, alen)) < 0 && errno == EINTR)
        ;
    if (dirfd >= 0) {
        int saved = errno;
        close(dirfd);
        errno = saved;
    }
    return rc;
}

/* Connect; R_NONE when connected. *foreign: the socket is another uid's (the
 * Python CLI then warns about it itself). Errors are classified like the
 * Python client's. */
enum result cl_connect_server(struct link *l, int *foreign) {
    *foreign = 0;
    l->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l->sock < 0)
        return R_REFUSED;
    if (connect_path(l->sock, (const char *)l->path.data, l->path.len) < 0)
        return errno == ENOENT || errno == ECONNREFUSED || errno == ENOTDIR ? R_NO_SERVER
                                                                            : R_REFUSED;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(l->sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
        return R_REFUSED;
    if (cred.uid != getuid())
        *foreign = 1;
    return R_NONE;
}

/* Send the frame in b (its first 4 bytes are filled with the length); with
 * fds 0, 1, 2 attached when with_stdio. R_NONE when sent. */
enum result cl_send_request(struct link *l, struct buf *b, int with_stdio) {
    size_t body = b->len - 4;
    b->data[0] = (unsigned char)(body >> 24);
    b->data[1] = (unsigned char)(body >> 16);
    b->data[2] = (unsigned char)(body >> 8);
    b->data[3] = (unsigned char)body;
    size_t off = 0;
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } control;
    while (off < b->len) {
        struct iovec iov = {.iov_base = b->data + off, .iov_len = b->len - off};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (off == 0 && with_stdio) {
            int fds[3] = {0, 1, 2};
            memset(&control, 0, sizeof control);
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
            cmsg->cmsg_level = SOL_SOCKET;
            cmsg->cmsg_type = SCM_RIGHTS;
            cmsg->cmsg_len = CMSG_LEN(sizeof fds);
            memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
        }
        ssize_t n = sendmsg(l->sock, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            /* Python: BrokenPipeError -> it is going away; any other OSError
             * (EBADF: a closed stdin/stdout/stderr) -> refused */
            return errno == EPIPE ? R_NO_SERVER : R_REFUSED;
        }
        off += (size_t)n;
    }
    return R_NONE;
}

/* Wait for the server (and, in run mode, for signals) and read more of its
 * answer. Returns the bytes read; 0 at the end of the stream or on an error
 * (a reset connection, an answer larger than a frame can be); -1 when a
 * signal arrived. */
ssize_t cl_receive(struct link *l) {
    unsigned char chunk[READ_CHUNK];
    for (;;) {
        struct pollfd fds[2] = {{.fd = l->sock, .events = POLLIN},
                                {.fd = cl_signal_pipe[0], .events = POLLIN}};
        int r = poll(fds, cl_signal_pipe[0] >= 0 ? 2 : 1, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return 0;
        }
        if (cl_signal_pipe[0] >= 0 && (fds[1].revents & POLLIN))
            return -1;
        ssize_t n = recv(l->sock, chunk, sizeof chunk, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return 0;
        }
        if (n > 0 && cl_buf_put(&l->reader.in, chunk, (size_t)n) < 0)
            return 0;
        return n;
    }
}
