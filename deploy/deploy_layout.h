/* deploy/deploy_layout.h: the zllm-deploy layout file (docs/deploy.md): parsed, validated and expanded into the
 * exact command lines of a broker, single workers and pipeline groups. Pure C: no ZeroMQ, no CUDA, so the
 * supervisor that forks the workers never initializes a device runtime itself.
 *
 * Layout (one directive a line, words separated by blanks, "..." groups a value with blanks, # comments):
 *   broker clients=EP workers=EP [curve-secret=FILE curve-allow=DIR [curve-workers=yes [curve-allow-workers=DIR]]]
 *          [args="..."]
 *   connect EP [server-key=BROKER.pub key=WORKER.key]   (where this host's workers connect; default: workers=)
 *   model NAME=PATH.gguf
 *   replica model=NAME [replicas=N] [stages=S] [devices=LIST] [name=PREFIX] [args="..."]
 *   http listen=HOST:PORT [broker=EP] [name=PREFIX] [api-key-file=FILE] [args="..."]   (a zllm-http gateway)
 *   rundir DIR | bin DIR | restart [limit=N] [window=S] [backoff-ms=MIN..MAX] | stop [timeout=S]
 * LIST: comma-separated cpu, cuda, cuda:N or cuda:A..B; "{rundir}" in any value is the run directory; relative
 * paths are relative to the layout file's directory. */
#ifndef ZLLM_DEPLOY_LAYOUT_H
#define ZLLM_DEPLOY_LAYOUT_H
#include <stddef.h>

#define DL_MAX_STAGES 16 /* stages of one pipeline group */
#define DL_MAX_UNITS 256 /* supervised units (broker + workers + groups) */
#define DL_NAME_MAX 48   /* unit names: letters, digits, '_', '-', '.' (also the shm group name) */
#define DL_PATH_MAX 1024

enum { DL_BROKER = 0, DL_WORKER = 1, DL_GROUP = 2, DL_HTTP = 3 };

typedef struct {
    char name[DL_NAME_MAX + 1];     /* unit name: worker --name, group --group, log file stem */
    int kind;                       /* DL_BROKER, DL_WORKER (one process), DL_GROUP (n_procs stages) or DL_HTTP */
    int line;                       /* layout line that made it */
    int n_procs;                    /* 1, or the group's stages */
    char **argv[DL_MAX_STAGES];     /* [n_procs] NULL-terminated command lines; argv[i][0] an absolute path */
    char device[DL_MAX_STAGES][32]; /* [n_procs] device of each process ("" for the broker) */
} dl_unit;

typedef struct {
    char rundir[DL_PATH_MAX];    /* run directory: logs, lock */
    char bindir[DL_PATH_MAX];    /* directory of zllm-broker and zllm-worker */
    int restart_limit;           /* restarts of one unit within restart_window_s before giving up (5) */
    int restart_window_s;        /* seconds (60) */
    int backoff_min_ms;          /* first restart delay, doubled per recent restart (500) */
    int backoff_max_ms;          /* cap (10000) */
    int stop_timeout_s;          /* per shutdown phase (broker drain, then workers) before SIGKILL (15) */
    dl_unit units[DL_MAX_UNITS]; /* [n_units]; the broker, when there is one, is units[0] */
    int n_units;
    char ipc_dirs[4][DL_PATH_MAX]; /* [n_ipc_dirs] parent folders of the broker's ipc:// endpoints (created) */
    int n_ipc_dirs;
} dl_plan;

/* Reads and validates the layout at path. rundir / bindir: command-line overrides or NULL; bindir_default: used
 * when neither the command line nor the layout names one. Checks that models, keys and binaries exist.
 * Returns the plan, or NULL with "PATH:LINE: what is wrong" in err (nothing is started or created). */
dl_plan *dl_load(const char *path, const char *rundir, const char *bindir, const char *bindir_default, char *err,
                 size_t errlen);
void dl_destroy(dl_plan **p);
#endif
