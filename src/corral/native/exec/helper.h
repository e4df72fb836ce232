/*
 * exec/helper.h: what the translation units of corral-exec share - the status
 * fd and its failure record, the main mode's restriction steps (common.c), the
 * mount helpers the --as-user stage borrows from the preview stage
 * (preview.c), each mode's entry point, and the state main() sets for them.
 *
 * Every name defined in one file and used in another starts with cx_; the
 * rest stays static in its file.
 */
#ifndef CORRAL_EXEC_HELPER_H
#define CORRAL_EXEC_HELPER_H

#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/syscall.h>

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

#define MAX_KEEP 16 /* --keep-fd (main) and --idmap (as-user) arguments */

/* ---------------------------------------------------------------- state main() sets */
extern int cx_status_fd;
extern int cx_want_ctty_global; /* --ctty, for the init's child */
extern int cx_serve_fd;         /* --serve: a resident session's control socket */
extern int cx_reap_signal;      /* --reaper SIG: stay the command's parent; SIG kills the tree */

/* ---------------------------------------------------------------- corral-exec.c */
void cx_usage(void) __attribute__((noreturn));

/* ---------------------------------------------------------------- common.c */
void cx_status_write(const char *buf, size_t len);
/* Report a setup failure and exit; the command never runs. */
void cx_fail(const char *step, int err, const char *fmt, ...) __attribute__((noreturn));
long cx_parse_long(const char *s, const char *what);
int cx_install_filter(int fd, unsigned long flags, const char *step);
void cx_send_fd(int sock, int fd);
void cx_apply_landlock(int fd);
int cx_rlimit_resource(const char *name);
void cx_cloexec_all(const int *keep, int nkeep);
void cx_drop_capabilities(void);

/* ---------------------------------------------------------------- preview.c */
void cx_write_file(const char *path, const char *text);
void cx_mount_kernel_overlay(const char *lower, const char *upper, const char *work, int in_userns);
int cx_mount_overlay_main(int argc, char **argv);

/* ---------------------------------------------------------------- identity.c */
int cx_as_user_main(int argc, char **argv);

/* ---------------------------------------------------------------- init.c */
/* the signals the init takes and passes on to the command, and their number */
extern const int cx_forwarded_signals[];
extern const size_t cx_nforwarded_signals;
/* the signals the init blocked, and the mask it found (init_take_signals) */
extern sigset_t cx_init_set, cx_init_old_mask;
void cx_init_take_signals(void);
void cx_run_as_init(void);
void cx_run_as_reaper(void);
int cx_hold_main(void);

/* ---------------------------------------------------------------- serve.c */
void cx_serve_main(void);

#endif
