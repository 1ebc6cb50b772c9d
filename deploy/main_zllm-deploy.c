/* deploy/main_zllm-deploy.c: zllm-deploy, one command that runs a broker and its workers from a layout file,
 * supervises them and stops them (docs/deploy.md).
 *
 *   zllm-deploy [--run-dir DIR] [--bin DIR] [--check] LAYOUT
 *
 * Pure C, linked without CUDA and never calling it: the workers it forks start with a clean process (no device
 * context inherited across fork). One thread; signals (SIGCHLD, SIGTERM, SIGINT, SIGHUP) are blocked and taken
 * synchronously with sigtimedwait, so there is no handler and no race between a child's exit and the loop.
 *
 * Children: fork + execv of absolute paths, each in its own process group (a terminal's Ctrl-C reaches only the
 * supervisor, which then stops them in order), with PR_SET_PDEATHSIG=SIGTERM (a supervisor killed with -9 does
 * not leave workers behind), stdin /dev/null, stdout+stderr appended to RUNDIR/NAME.log.
 * Restarts: a dead worker is started again after a backoff (backoff-ms MIN doubled per restart within the
 * window, at most MAX); a pipeline group is restarted whole: the surviving stages get SIGTERM (SIGKILL after the
 * stop timeout), then all stages start again under the same group name (the new leader re-creates the shm
 * segment). More than `limit` restarts of one unit within `window` seconds, or an exit status 2 (a usage error:
 * restarting cannot help), stops everything and exits 1.
 * Stop (SIGTERM/SIGINT/SIGHUP): SIGTERM the broker and wait for its drain (up to the stop timeout), then SIGTERM
 * the workers and pipeline leaders, and the followers once their leader is gone; SIGKILL whatever is left after
 * another stop timeout; remove the groups' shm segments (shm_group_unlink); exit 0. A second signal kills at once.
 *
 * Include map:
 *   deploy_layout.h - dl_load/dl_destroy: the layout file, validated, as command lines
 *   shmring.h       - shm_group_unlink: a failed group's segment */
#include "deploy_layout.h"
#include "shmring.h"
#include "version.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define S_HIST 1024    /* restart times remembered per unit (the restart limit is at most this) */
#define S_LOOP_MS 1000 /* longest wait of the loop without an event */

enum { S_RUNNING, S_STOPPING, S_WAITING, S_DONE };

typedef struct {
    pid_t pid[DL_MAX_STAGES]; /* [n_procs] running pids, 0 when not running */
    int state;                /* S_RUNNING; S_STOPPING (group: killing survivors for a restart);
                                      S_WAITING (restart due); S_DONE (stopped for good) */
    int64_t t_start;          /* ms, monotonic: last start */
    int64_t due;              /* ms: S_WAITING restart time, S_STOPPING SIGKILL time */
    int64_t hist[S_HIST];     /* ms: restart times, ring */
    int n_hist;               /* restarts ever (ring index = n_hist % S_HIST) */
    int usage_error;          /* a process of the current run exited 2 */
    int shm_dirty;            /* group: its leader's last exit was not a clean 0, so its /dev/shm segment
                                      may be left (a clean leader unlinks its own) */
} s_unit;

typedef struct {
    dl_plan *plan;     /* the layout */
    s_unit *u;         /* [plan->n_units] */
    pid_t self;        /* our pid (children check their parent after PR_SET_PDEATHSIG) */
    int stopping;      /* 0; 1: broker phase; 2: worker phase */
    int64_t phase_due; /* ms: SIGKILL time of the current stop phase */
    int exit_code;     /* 0, or 1 after giving up on a unit */
} s_sup;

static int64_t s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* one line on stdout per event, UTC time stamped */
static void s_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void s_say(const char *fmt, ...) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ zllm-deploy: %s\n", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, msg);
    fflush(stdout);
}

static void s_proc_name(const dl_unit *d, int s, char *out, size_t outlen) {
    if (d->kind == DL_GROUP) snprintf(out, outlen, "%s.s%d", d->name, s);
    else snprintf(out, outlen, "%s", d->name);
}

/* mkdir -p; 0 or -1 (errno) */
static int s_mkdirs(const char *path) {
    char buf[DL_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* forks and execs process s of unit i; returns the pid, or 0 when fork failed (handled as an immediate exit) */
static pid_t s_spawn(s_sup *S, int i, int s) {
    const dl_unit *d = &S->plan->units[i];
    char name[DL_NAME_MAX + 8], log[DL_PATH_MAX + 64], head[DL_PATH_MAX * 2];
    s_proc_name(d, s, name, sizeof name);
    snprintf(log, sizeof log, "%s/%s.log", S->plan->rundir, name);
    /* everything the child writes is prepared here: after fork it only makes system calls */
    size_t o = (size_t)snprintf(head, sizeof head, "---- zllm-deploy: starting");
    for (char **a = d->argv[s]; *a && o < sizeof head - 2; a++)
        o += (size_t)snprintf(head + o, sizeof head - o, " %s", *a);
    if (o > sizeof head - 2) o = sizeof head - 2;
    head[o++] = '\n';
    static const char execfail[] = "---- zllm-deploy: execv failed\n";
    pid_t pid = fork();
    if (pid < 0) {
        s_say("fork for %s: %s", name, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != S->self) _exit(1); /* the supervisor died before the prctl */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl; /* an ignored SIGPIPE would survive execv */
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int nul = open("/dev/null", O_RDONLY);
        if (fd < 0 || nul < 0) _exit(126);
        dup2(nul, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
        if (nul > 2) close(nul);
        ssize_t w = write(2, head, o);
        (void)w;
        execv(d->argv[s][0], d->argv[s]);
        w = write(2, execfail, sizeof execfail - 1);
        _exit(127);
    }
    s_say("start %s pid %d%s%s (log %s)", name, (int)pid, d->device[s][0] ? " on " : "", d->device[s], log);
    return pid;
}

static void s_start_unit(s_sup *S, int i) {
    s_unit *u = &S->u[i];
    const dl_unit *d = &S->plan->units[i];
    u->state = S_RUNNING;
    u->usage_error = 0;
    u->t_start = s_now_ms();
    for (int s = 0; s < d->n_procs; s++) u->pid[s] = s_spawn(S, i, s);
}

static int s_alive_procs(const s_sup *S, int i) {
    int n = 0;
    for (int s = 0; s < S->plan->units[i].n_procs; s++) n += S->u[i].pid[s] > 0;
    return n;
}

static void s_signal_unit(s_sup *S, int i, int sig, int from_stage) {
    for (int s = from_stage; s < S->plan->units[i].n_procs; s++)
        if (S->u[i].pid[s] > 0) kill(S->u[i].pid[s], sig);
}

/* a unit whose processes are all gone: restart after the backoff, or give up */
static void s_schedule(s_sup *S, int i) {
    s_unit *u = &S->u[i];
    const dl_plan *pl = S->plan;
    const dl_unit *d = &pl->units[i];
    int64_t now = s_now_ms();
    if (u->usage_error) {
        s_say("%s: exit status 2 (bad arguments, see its log): not restarting; stopping everything", d->name);
        u->state = S_DONE;
        S->exit_code = 1;
        return;
    }
    int recent = 0;
    for (int k = 0; k < u->n_hist && k < S_HIST; k++)
        if (now - u->hist[k] < (int64_t)pl->restart_window_s * 1000) recent++;
    if (recent >= pl->restart_limit) {
        s_say("%s: %d restarts within %d s (limit %d): giving up; stopping everything", d->name, recent,
              pl->restart_window_s, pl->restart_limit);
        u->state = S_DONE;
        S->exit_code = 1;
        return;
    }
    int64_t delay = pl->backoff_min_ms;
    for (int k = 0; k < recent && delay < pl->backoff_max_ms; k++) delay *= 2;
    if (delay > pl->backoff_max_ms) delay = pl->backoff_max_ms;
    u->hist[u->n_hist++ % S_HIST] = now;
    u->state = S_WAITING;
    u->due = now + delay;
    s_say("restart %s in %lld ms (restart %d within %d s, limit %d)", d->name, (long long)delay, recent + 1,
          pl->restart_window_s, pl->restart_limit);
}

static void s_on_exit(s_sup *S, pid_t pid, int status) {
    int i = -1, s = -1;
    for (int k = 0; k < S->plan->n_units && i < 0; k++)
        for (int j = 0; j < S->plan->units[k].n_procs; j++)
            if (S->u[k].pid[j] == pid) {
                i = k;
                s = j;
                break;
            }
    if (i < 0) return; /* not ours (cannot happen: we fork only these) */
    s_unit *u = &S->u[i];
    const dl_unit *d = &S->plan->units[i];
    u->pid[s] = 0;
    char name[DL_NAME_MAX + 8], how[64];
    s_proc_name(d, s, name, sizeof name);
    if (WIFEXITED(status)) snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
    else snprintf(how, sizeof how, "status 0x%x", status);
    s_say("exit %s pid %d: %s after %.1f s", name, (int)pid, how, (double)(s_now_ms() - u->t_start) / 1000.0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2 && u->state == S_RUNNING) u->usage_error = 1;
    if (d->kind == DL_GROUP && s == 0) u->shm_dirty = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (S->stopping || u->state == S_DONE) return;
    if (d->kind == DL_GROUP && u->state == S_RUNNING && s_alive_procs(S, i) > 0) {
        /* one stage gone: the group has failed (a stage cannot rejoin); stop the others, then restart all */
        s_say("group %s: stage %d gone: stopping the other stages to restart the group", d->name, s);
        u->state = S_STOPPING;
        u->due = s_now_ms() + (int64_t)S->plan->stop_timeout_s * 1000;
        s_signal_unit(S, i, SIGTERM, 0);
    }
    if (s_alive_procs(S, i) == 0) s_schedule(S, i);
}

/* removes the segments of groups whose leader did not exit cleanly (only those: a group of the same name in
 * another deployment on this host must not lose its segment because ours stopped cleanly) */
static void s_unlink_groups(const s_sup *S) {
    for (int i = 0; i < S->plan->n_units; i++) {
        const dl_unit *d = &S->plan->units[i];
        if (d->kind != DL_GROUP || !S->u[i].shm_dirty) continue;
        if (shm_group_unlink(d->name) == 0) s_say("removed the shm segment of group %s", d->name);
    }
}

/* stop phases: 1 = the broker drains; 2 = the workers and leaders, then the followers */
static void s_stop_phase(s_sup *S, int phase) {
    S->stopping = phase;
    S->phase_due = s_now_ms() + (int64_t)S->plan->stop_timeout_s * 1000;
    for (int i = 0; i < S->plan->n_units; i++) {
        const dl_unit *d = &S->plan->units[i];
        if (S->u[i].state == S_WAITING) S->u[i].state = S_DONE;
        if (phase == 1 && d->kind == DL_BROKER && S->u[i].pid[0] > 0) {
            s_say("stopping: SIGTERM broker (drain up to %d s)", S->plan->stop_timeout_s);
            kill(S->u[i].pid[0], SIGTERM);
        }
        if (phase == 2 && d->kind != DL_BROKER && S->u[i].pid[0] > 0) kill(S->u[i].pid[0], SIGTERM);
    }
    if (phase == 2) s_say("stopping: SIGTERM workers (up to %d s)", S->plan->stop_timeout_s);
}

static int s_broker_alive(const s_sup *S) {
    for (int i = 0; i < S->plan->n_units; i++)
        if (S->plan->units[i].kind == DL_BROKER && S->u[i].pid[0] > 0) return 1;
    return 0;
}

static int s_any_alive(const s_sup *S) {
    for (int i = 0; i < S->plan->n_units; i++)
        if (s_alive_procs(S, i)) return 1;
    return 0;
}

static void s_kill_all(s_sup *S) {
    for (int i = 0; i < S->plan->n_units; i++)
        for (int s = 0; s < S->plan->units[i].n_procs; s++)
            if (S->u[i].pid[s] > 0) {
                char name[DL_NAME_MAX + 8];
                s_proc_name(&S->plan->units[i], s, name, sizeof name);
                s_say("SIGKILL %s pid %d", name, (int)S->u[i].pid[s]);
                kill(S->u[i].pid[s], SIGKILL);
            }
}

/* timers: restarts due, group survivors to kill, stop phases; returns ms until the next one (capped) */
static int64_t s_timers(s_sup *S) {
    int64_t now = s_now_ms(), next = now + S_LOOP_MS;
    if (S->stopping == 1 && (!s_broker_alive(S) || now >= S->phase_due)) {
        for (int i = 0; i < S->plan->n_units; i++) /* a broker still draining: SIGKILL it, then the workers */
            if (S->plan->units[i].kind == DL_BROKER && S->u[i].pid[0] > 0) {
                s_say("SIGKILL broker pid %d (still draining after %d s)", (int)S->u[i].pid[0],
                      S->plan->stop_timeout_s);
                kill(S->u[i].pid[0], SIGKILL);
            }
        s_stop_phase(S, 2);
        now = s_now_ms();
    }
    if (S->stopping == 2) {
        /* followers: SIGTERM once their leader is gone (a follower's SIGTERM first would fail the group) */
        for (int i = 0; i < S->plan->n_units; i++)
            if (S->plan->units[i].kind == DL_GROUP && S->u[i].pid[0] == 0 && s_alive_procs(S, i) > 0 &&
                S->u[i].state != S_DONE) {
                S->u[i].state = S_DONE;
                s_signal_unit(S, i, SIGTERM, 1);
            }
        if (now >= S->phase_due && s_any_alive(S)) {
            s_kill_all(S);
            S->phase_due = now + 1000000;
        }
        if (S->phase_due < next) next = S->phase_due;
        return next - now;
    }
    if (S->stopping) return S->phase_due < next ? S->phase_due - now : next - now;
    for (int i = 0; i < S->plan->n_units; i++) {
        s_unit *u = &S->u[i];
        if (u->state == S_WAITING && now >= u->due) {
            s_start_unit(S, i);
            for (int s = 0; s < S->plan->units[i].n_procs; s++)
                if (u->pid[s] == 0) { /* fork failed: as if it exited at once */
                    u->state = S_STOPPING;
                    s_signal_unit(S, i, SIGTERM, 0);
                    u->due = now + (int64_t)S->plan->stop_timeout_s * 1000;
                    if (s_alive_procs(S, i) == 0) s_schedule(S, i);
                    break;
                }
        } else if (u->state == S_STOPPING && now >= u->due) {
            s_signal_unit(S, i, SIGKILL, 0);
            u->due = now + 1000000;
        }
        if ((u->state == S_WAITING || u->state == S_STOPPING) && u->due < next) next = u->due;
    }
    if (S->exit_code && !S->stopping) {
        s_stop_phase(S, 1);
        return 0;
    }
    return next > now ? next - now : 0;
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-deploy [--run-dir DIR] [--bin DIR] [--check] LAYOUT\n"
               "       zllm-deploy --help | --version\n"
               "  --run-dir DIR   logs and the lock file (default: the layout's 'rundir', else /tmp/zllm-deploy)\n"
               "  --bin DIR       where zllm-broker and zllm-worker are (default: the layout's 'bin', else the\n"
               "                  directory of zllm-deploy itself)\n"
               "  --check         validate the layout, print the command lines, start nothing\n"
               "Runs until SIGTERM/SIGINT (exit 0 after stopping everything); exit 1 when a unit exceeds its\n"
               "restart limit, 2 for a bad layout or arguments. Layout format: docs/deploy.md.\n"
               "  -h, --help      this text;  --version  print the version\n"
               "Environment: none read (the units it starts get the environment it was started with).\n");
}

int main(int argc, char **argv) {
    const char *layout = NULL, *rundir = NULL, *bindir = NULL;
    int check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("zllm-deploy %s\n", ZLLM_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) rundir = argv[++i];
        else if (!strcmp(argv[i], "--bin") && i + 1 < argc) bindir = argv[++i];
        else if (argv[i][0] != '-' && !layout) layout = argv[i];
        else {
            fprintf(stderr, "zllm-deploy: bad argument '%s'\n", argv[i]);
            s_usage(stderr);
            return 2;
        }
    }
    if (!layout) {
        s_usage(stderr);
        return 2;
    }
    /* default binary directory: our own */
    char self[DL_PATH_MAX] = ".";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *sl = strrchr(self, '/');
        if (sl && sl != self) *sl = 0;
    } else {
        snprintf(self, sizeof self, ".");
    }
    char err[1024];
    s_sup S;
    memset(&S, 0, sizeof S);
    S.plan = dl_load(layout, rundir, bindir, self, err, sizeof err);
    if (!S.plan) {
        fprintf(stderr, "zllm-deploy: %s\n", err);
        return 2;
    }
    dl_plan *pl = S.plan;
    if (check) {
        printf("rundir %s\nbin %s\nrestart limit=%d window=%d backoff-ms=%d..%d\nstop timeout=%d\n", pl->rundir,
               pl->bindir, pl->restart_limit, pl->restart_window_s, pl->backoff_min_ms, pl->backoff_max_ms,
               pl->stop_timeout_s);
        for (int i = 0; i < pl->n_units; i++) {
            const dl_unit *d = &pl->units[i];
            for (int s = 0; s < d->n_procs; s++) {
                char name[DL_NAME_MAX + 8];
                s_proc_name(d, s, name, sizeof name);
                printf("%s (line %d):", name, d->line);
                for (char **a = d->argv[s]; *a; a++) printf(" %s", *a);
                printf("\n");
            }
        }
        dl_destroy(&S.plan);
        return 0;
    }
    int rc = 1, lock = -1;
    S.u = calloc((size_t)pl->n_units, sizeof *S.u);
    if (!S.u) {
        fprintf(stderr, "zllm-deploy: out of memory\n");
        goto done;
    }
    if (s_mkdirs(pl->rundir) != 0) {
        fprintf(stderr, "zllm-deploy: %s: %s\n", pl->rundir, strerror(errno));
        goto done;
    }
    for (int i = 0; i < pl->n_ipc_dirs; i++)
        if (s_mkdirs(pl->ipc_dirs[i]) != 0) {
            fprintf(stderr, "zllm-deploy: %s: %s\n", pl->ipc_dirs[i], strerror(errno));
            goto done;
        }
    char lockpath[DL_PATH_MAX + 32];
    snprintf(lockpath, sizeof lockpath, "%s/zllm-deploy.lock", pl->rundir);
    lock = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "zllm-deploy: %s: %s\n", lockpath,
                lock < 0 ? strerror(errno) : "another zllm-deploy runs here");
        goto done;
    }
    char pidtxt[32];
    int pn = snprintf(pidtxt, sizeof pidtxt, "%d\n", (int)getpid());
    if (ftruncate(lock, 0) != 0 || write(lock, pidtxt, (size_t)pn) != pn) { /* informative only */
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN); /* stdout may be a closed pipe: the event lines are lost, the children are not */
    S.self = getpid();
    s_say("layout %s: %d unit(s), run directory %s, binaries %s", layout, pl->n_units, pl->rundir, pl->bindir);
    /* the broker first (it binds the endpoints the workers connect to; they retry anyway) */
    for (int i = 0; i < pl->n_units; i++) s_start_unit(&S, i);
    for (int i = 0; i < pl->n_units; i++)
        for (int s = 0; s < pl->units[i].n_procs; s++)
            if (S.u[i].pid[s] == 0 && S.u[i].state == S_RUNNING) {
                S.u[i].state = S_STOPPING;
                S.u[i].due = s_now_ms();
                if (s_alive_procs(&S, i) == 0) s_schedule(&S, i);
            }
    int signals = 0;
    for (;;) {
        int64_t wait = s_timers(&S);
        if (S.stopping && !s_any_alive(&S)) break;
        if (wait < 0) wait = 0;
        struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
        siginfo_t info;
        int sig = sigtimedwait(&set, &info, &ts);
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
            signals++;
            if (signals == 1) {
                s_say("signal %d: stopping", sig);
                s_stop_phase(&S, 1);
            } else {
                s_say("signal %d again: killing everything now", sig);
                s_kill_all(&S);
            }
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) s_on_exit(&S, pid, status);
    }
    s_unlink_groups(&S);
    rc = S.exit_code;
    s_say("stopped (exit %d)", rc);
done:
    if (lock >= 0) close(lock);
    free(S.u);
    dl_destroy(&S.plan);
    return rc;
}
