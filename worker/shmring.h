/* worker/shmring.h: single-producer single-consumer rings of fixed-size slots in one POSIX shared-memory
 * segment (a "group"), shared by the processes of a pipeline (worker/stage.h) on one host.
 *
 * Layout of a segment: a header (magic, version, total size, a generation nonce, an abort word, one record per
 * member process: pid, heartbeat, state; member 0's pid is the creator's), an opaque info blob written by the
 * creator (what the members must agree on), then the rings. Each ring has cap slots of slot_bytes; a slot starts
 * with a small header (group generation, sequence number, payload bytes) that the reader validates before use,
 * so a slot left by an earlier group or written out of order is refused rather than read.
 *
 * Names and ownership: the segment of group NAME is the file /dev/shm/zllm-NAME.UID.RANDOM (UID the effective
 * uid, RANDOM 16 hex digits), created with O_EXCL and mode 0600, so another user can neither predict nor take
 * the name, and a file that another user put there is never opened as ours. Members find it by scanning
 * /dev/shm for this uid's NAME and attach only to a regular file owned by their effective uid with no group or
 * other permission bits (fstat), fully initialized (ready word), of the size its header says, whose creator is
 * alive. Every process of the uid (and root) can still write the segment: after attach nothing read from it is
 * trusted. The geometry and the info blob are copied into private memory once, every slot address comes from
 * that copy, each side keeps its own ring counter privately, and every index, size and counter read from the
 * segment is checked on every access; a value written by another process gives an error, never an access
 * outside the segment.
 *
 * Cleanup: the creator first removes this uid's segments whose creator process is gone (shm_group_sweep) and
 * the earlier segments of NAME, and removes its own on destroy; a member removes it on destroy once nobody can
 * join any more (the group stopped or failed, or its creator is gone). So a segment outlives its group only
 * when every member was killed at once, until the uid's next creator starts. One pid namespace per /dev/shm:
 * creator pids are checked with kill(pid, 0).
 *
 * Safety of waits: waits sleep on a futex in slices of a few milliseconds and, between slices, refresh this
 * member's heartbeat and check the other members and this process's own ring counters: a member whose pid is
 * gone or whose heartbeat is older than dead_ms, an abort set by anyone, or a shared counter of this process
 * that another process rewrote ends the wait with an error, so the death of one process brings the others down
 * within a few slices and a tampered counter cannot leave a stage waiting forever. A group handle's ring
 * operations come from one thread (the monitor functions below may run in another). Nothing here calls exit(). */
#ifndef ZLLM_SHMRING_H
#define ZLLM_SHMRING_H
#include <stddef.h>
#include <stdint.h>

#define SHM_MAX_MEMBERS 16 /* processes in one group */
#define SHM_MAX_RINGS 32   /* rings in one group */
#define SHM_MAX_INFO 4096  /* bytes of the creator's info blob */

/* abort word values */
enum { SHM_RUNNING = 0, SHM_SHUTDOWN = 1, SHM_FAILED = 2 };

typedef struct {
    uint32_t cap;           /* slots, 1..4096 */
    uint64_t payload_bytes; /* usable bytes per slot (the slot header is added) */
} shm_ring_spec;

typedef struct shm_group shm_group;

/* Creator (member 0): sweeps stale segments, removes earlier segments of this uid's group `name`, creates and
 * sizes a new segment under a fresh random name for the rings and info, with a new generation, and publishes it.
 * name: [A-Za-z0-9_.-], 1..64 chars. Returns NULL with a message (bad name or specs, sizes overflow,
 * open/ftruncate/mmap failed: e.g. /dev/shm too small); nothing is left in /dev/shm then. */
shm_group *shm_group_create(const char *name, int n_members, const shm_ring_spec *rings, int n_rings, const void *info,
                            size_t info_bytes, char *err, size_t errlen);
/* Member `member` (1..n_members-1) attaches to this uid's segment of group `name`, waiting up to timeout_ms for
 * a live creator's ready segment. Files of another owner or with group/other permission bits are refused (the
 * timeout's message says so). Returns NULL with a message (timeout, member slot taken by a live process). */
shm_group *shm_group_attach(const char *name, int member, int timeout_ms, char *err, size_t errlen);
/* Creator: waits until every member has attached (or timeout_ms). 0, or -1 with a message. */
int shm_group_wait_members(shm_group *g, int timeout_ms, char *err, size_t errlen);
/* Sets the abort word (SHM_SHUTDOWN or SHM_FAILED; a failure is never downgraded) and wakes every waiter. */
void shm_group_abort(shm_group *g, int why);
/* the abort word now (SHM_RUNNING, SHM_SHUTDOWN, SHM_FAILED) */
int shm_group_aborted(const shm_group *g);
/* Refreshes this member's heartbeat (done by every wait; call it between long computations too). */
void shm_group_heartbeat(shm_group *g);
/* 0 while the group runs and every attached member is alive; -1 with a message (abort, dead or silent member,
 * generation changed). Reads only: safe from a monitor thread. */
int shm_group_check(shm_group *g, char *err, size_t errlen);
/* the creator's info blob and its size */
const void *shm_group_info(const shm_group *g, size_t *bytes);
uint64_t shm_group_generation(const shm_group *g);
int shm_group_rings(const shm_group *g);
/* a member is considered dead when its heartbeat is older than this (default 10000 ms); pids are checked on
 * every slice whatever this is */
void shm_group_set_dead_ms(shm_group *g, int ms);
/* 1 when member `member` has left the group (shm_group_destroy'd its mapping) or its process is gone, 0 while
 * it is attached and alive, or -1 for a bad index. Lets an owner of resources shared with that member (CUDA IPC
 * buffers) free them only after the member closed its handles. */
int shm_group_member_gone(const shm_group *g, int member);
/* Unmaps; unlinks the segment's name if it still holds this generation and this is the creator, or the group
 * stopped or failed, or its creator is gone. Idempotent. */
void shm_group_destroy(shm_group **g);
/* Unlinks every segment of this uid's group `name`, live or not (operators: clearing a dead group). 0, or -1 if
 * there was none. */
int shm_group_unlink(const char *name);
/* Unlinks this uid's segments (any group) whose creator process is gone, and ones left uninitialized for a
 * minute (a creator killed while creating). Returns how many. shm_group_create calls it. */
int shm_group_sweep(void);
/* the segment's file, "/dev/shm/zllm-NAME.UID.RANDOM" */
const char *shm_group_path(const shm_group *g);

/* Producer: waits (timeout_ms < 0: no limit) for a free slot of ring r and returns its payload
 * (payload_bytes writable) in *payload. 0; 1 on timeout; -1 with a message (abort, dead member, corrupt ring). */
int shm_ring_reserve(shm_group *g, int r, int timeout_ms, void **payload, char *err, size_t errlen);
/* Producer: publishes the reserved slot with bytes (<= payload_bytes) of payload. -1 on bad bytes. */
int shm_ring_publish(shm_group *g, int r, uint64_t bytes, char *err, size_t errlen);
/* Consumer: waits for the next slot of ring r and returns its validated payload and size. 0; 1 on timeout; -1
 * with a message (abort, dead member, stale generation, out-of-order sequence, bad size). */
int shm_ring_peek(shm_group *g, int r, int timeout_ms, const void **payload, uint64_t *bytes, char *err, size_t errlen);
/* Consumer: frees the slot returned by shm_ring_peek. */
void shm_ring_release(shm_group *g, int r);
uint64_t shm_ring_payload_bytes(const shm_group *g, int r); /* 0 for a bad ring index */
#endif
