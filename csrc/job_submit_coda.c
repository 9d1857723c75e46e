/*
 * job_submit/coda: the C face of a Slurm job_submit plugin whose logic is Python.
 *
 * This file is compiled by cffi in embedding mode (csrc/build_plugin.py) into
 * job_submit_coda.so.  It only does what must happen in C:
 *   - the plugin symbols slurmctld looks for (plugin_name/type/version, init, fini,
 *     job_submit, job_modify);
 *   - starting the embedded interpreter safely inside slurmctld;
 *   - two helpers Python calls back: logging into slurmctld's log and replacing a
 *     string field of job_desc with memory from Slurm's own allocator.
 *   - the replay table: a job whose decision fields match one Python already
 *     decided, under the same coda.conf and profile snapshot, is answered here
 *     without entering Python (see "replay" below).
 * Every decision is made in slurm_plugin/hook/submit.py.
 *
 * Failure policy: nothing in here may stop slurmctld from scheduling.  If Python
 * cannot start, init() logs why at error level and still returns SLURM_SUCCESS;
 * job_submit()/job_modify() then accept every job unchanged.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

/* @CODA_PRELUDE@ */

/* Exported by slurmctld itself (libslurmfull.so, linked into the daemon).  We do
 * not link any Slurm library: the plugin must use the allocator of the slurmctld
 * that loads it, because Slurm frees job_desc strings with xfree(). */
extern void slurm_xfree(void **item);
extern char *slurm_xstrdup(const char *str);
extern void slurm_error(const char *fmt, ...);
extern void slurm_info(const char *fmt, ...);
extern void slurm_verbose(const char *fmt, ...);
extern void slurm_debug(const char *fmt, ...);

const char plugin_name[] = "CODA: CPU right-sizing for GPU jobs";
const char plugin_type[] = "job_submit/coda";
/* slurmctld refuses a plugin whose version differs from its own, so this is the
 * SLURM_VERSION_NUMBER of the headers we are built against. */
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* 1 once Python is running and slurm_plugin.hook.submit is loaded. */
static int coda_active = 0;

#define CODA_LOG_ERROR 0
#define CODA_LOG_INFO 1
#define CODA_LOG_VERBOSE 2
#define CODA_LOG_DEBUG 3

/* Called from Python: one line into slurmctld's log with our prefix. */
static void coda_log(int level, const char *msg)
{
	switch (level) {
	case CODA_LOG_ERROR:
		slurm_error("job_submit/coda: %s", msg);
		break;
	case CODA_LOG_INFO:
		slurm_info("job_submit/coda: %s", msg);
		break;
	case CODA_LOG_VERBOSE:
		slurm_verbose("job_submit/coda: %s", msg);
		break;
	default:
		slurm_debug("job_submit/coda: %s", msg);
		break;
	}
}

/* Called from Python: replace *slot with a copy of value (NULL clears it). */
static void coda_replace_str(char **slot, const char *value)
{
	if (*slot)
		slurm_xfree((void **) slot);
	*slot = value ? slurm_xstrdup(value) : NULL;
}

/* Slurm 25.11 moved the job id of job_desc_msg_t into step_id. */
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
#define CODA_JOB_ID(d) ((d)->step_id.job_id)
#else
#define CODA_JOB_ID(d) ((d)->job_id)
#endif

/* Called from Python: the job id (NO_VAL until slurmctld assigns one). */
static uint32_t coda_job_id(const job_desc_msg_t *d)
{
	return CODA_JOB_ID(d);
}

/* For in-process tests: set the job id as slurmctld would. */
static void coda_set_job_id(job_desc_msg_t *d, uint32_t job_id)
{
	CODA_JOB_ID(d) = job_id;
}

/* Set the "cpu=N" item of a tres_per_task list to "cpu=NOW" ("cpu=2,gres/gpu=1"
 * becomes "cpu=4,gres/gpu=1"); other items are kept as they are.  Slurm 23.11 and
 * later keep -c there too, and ask the node for that count.  Returns 0 when
 * memory runs out (the list is then left as it was), else 1. */
static int coda_set_task_cpus(char **slot, uint16_t now)
{
	const char *p = *slot;
	char *out, *o;
	size_t n, cap;

	if (!p || !strstr(p, "cpu="))
		return 1;
	/* Each "cpu=..." item (4 characters at least) grows by at most 5: twice the
	 * length holds any list. */
	cap = 2 * strlen(p) + 8;
	out = malloc(cap);
	if (!out)
		return 0;
	o = out;
	while (*p) {
		n = strcspn(p, ",");
		if (o != out)
			*o++ = ',';
		if (n >= 4 && strncmp(p, "cpu=", 4) == 0) {
			o += snprintf(o, cap - (size_t) (o - out), "cpu=%u",
				      (unsigned) now);
		} else {
			memcpy(o, p, n);
			o += n;
		}
		p += n;
		if (*p == ',')
			p++;
	}
	*o = '\0';
	coda_replace_str(slot, out);
	free(out);
	return 1;
}

/* Called from Python and by the replay table when coda rewrites the user's -c to
 * NOW CPUs per task: -c and all sbatch derived from it (src/sbatch/opt.c raises
 * pn_min_cpus to it; min_cpus is tasks x -c; from 23.11 tres_per_task carries
 * cpu=N) move together, so Slurm gives every task NOW CPUs and says so in
 * SLURM_CPUS_PER_TASK.  A larger --mincpus of the user's own is kept.  Nothing
 * changes when memory runs out. */
static void coda_set_cpus_per_task(job_desc_msg_t *d, uint16_t now)
{
	uint16_t cpt = d->cpus_per_task;

	if (cpt == 0 || cpt >= NO_VAL16 || now == 0 || now >= NO_VAL16)
		return;
	if (!coda_set_task_cpus(&d->tres_per_task, now))
		return;
	if (d->pn_min_cpus == cpt)
		d->pn_min_cpus = now;
	if (d->min_cpus != NO_VAL && d->min_cpus >= cpt && d->min_cpus % cpt == 0)
		d->min_cpus = d->min_cpus / cpt * now;
	d->cpus_per_task = now;
}

/* Called from Python and by the replay table when the user's --cpus-per-gpu=WAS is
 * rewritten to NOW: sbatch from 23.11 on sends min_cpus = WAS x GPUs, and Slurm
 * refuses a job whose min_cpus its new --cpus-per-gpu cannot give.  Any other
 * min_cpus (22.05 sends the task count) is left as it is. */
static void coda_rescale_min_cpus(job_desc_msg_t *d, uint32_t was, uint32_t now)
{
	if (!was || !now || d->min_cpus == NO_VAL || d->min_cpus < was ||
	    d->min_cpus % was)
		return;
	d->min_cpus = d->min_cpus / was * now;
}

/*
 * Replay: repeated jobs answered without entering Python.
 *
 * Inside slurmctld every submission arrives on a fresh RPC thread with cold caches,
 * and entering the embedded interpreter costs more than the decision itself
 * (docs/benchmarks.md, "Submission latency").  hook.py's decide() is pure given the
 * job_desc fields it reads, coda.conf and the profile snapshot, so once Python has
 * decided a job it hands this file the plan (coda_memo_put): the values to write,
 * the user message, the log line.  A later job whose fields are byte-for-byte the
 * same gets that plan applied here, and a small record (coda_replay_t) goes into a
 * ring that Python drains on its reloader thread for the counters and the decision
 * journal.
 *
 * Python owns validity: it empties the table (coda_memo_reset, a new generation)
 * whenever the profile snapshot or coda.conf changes, and a plan decided under an
 * older generation is refused.  The table is bounded like hook.py's DecisionMemo
 * (entries, key bytes) and empties itself when full.  When the ring is full or no
 * plan matches, the job goes to Python as before.  One mutex guards it all:
 * slurmctld already serialises job_submit under its job write lock, so the lock
 * is contended only by Python's reloader thread for the time of a drain.
 */
#define CODA_MEMO_MAX_ENTRIES 4096
#define CODA_MEMO_SLOTS 8192 /* a power of two, at least twice the entries */
#define CODA_MEMO_MAX_KEY_BYTES ((size_t) 32 << 20)
#define CODA_RING_RECORDS 65536
#define CODA_KEY_STRINGS 10

typedef struct {
	int64_t plan_id;    /* 0: a job asking for no GPU, passed without a word */
	int64_t unix_ns;    /* when it was answered (CLOCK_REALTIME) */
	int64_t elapsed_ns; /* time spent here (CLOCK_MONOTONIC) */
	uint64_t token;     /* the decision's token in the admin record; 0: none */
	uint32_t job_id;
} coda_replay_t;

struct coda_memo_entry {
	uint64_t hash;
	uint32_t uid, min_nodes, num_tasks;
	uint16_t cpus_per_task, ntasks_per_node, sockets_per_node;
	uint32_t cpg_was, cpg_now; /* coda_rescale_min_cpus(); 0: not called */
	char *key[CODA_KEY_STRINGS]; /* NULL where job_desc had NULL */
	size_t key_len[CODA_KEY_STRINGS];
	size_t key_bytes;
	int64_t plan_id;
	char *cpus_per_tres, *tres_per_node, *prefer, *partition;
	char *admin_comment, *admin_note, *user_msg, *log_line;
	uint16_t cpus_per_task_now; /* coda_set_cpus_per_task(); 0: not called */
	int log_level; /* < 0: no line */
};

static struct {
	pthread_mutex_t lock;
	int enabled, cpu_jobs_silent;
	int64_t gen;
	uint64_t last_token;
	struct coda_memo_entry **slot; /* CODA_MEMO_SLOTS, open addressing */
	int entries;
	size_t key_bytes;
	coda_replay_t ring[CODA_RING_RECORDS];
	uint32_t ring_head, ring_count;
} coda_memo = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The job_desc strings the decision reads, in a fixed order. */
static void coda_key_strings(const job_desc_msg_t *d, const char *s[CODA_KEY_STRINGS])
{
	s[0] = d->name;
	s[1] = d->partition;
	s[2] = d->tres_per_node;
	s[3] = d->tres_per_job;
	s[4] = d->tres_per_task;
	s[5] = d->tres_per_socket;
	s[6] = d->cpus_per_tres;
	s[7] = d->comment;
	s[8] = d->script;
	s[9] = d->prefer;
}

static inline uint64_t coda_mix(uint64_t h, uint64_t v)
{
	h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 29);
}

/* The key of a job: its hash, and the lengths of its strings (SIZE_MAX: NULL). */
static uint64_t coda_key_hash(const job_desc_msg_t *d, uint32_t uid,
			      const char *s[CODA_KEY_STRINGS],
			      size_t len[CODA_KEY_STRINGS])
{
	uint64_t h = 0x243f6a8885a308d3ULL, w;
	size_t i, n, j;

	h = coda_mix(h, uid);
	h = coda_mix(h, ((uint64_t) d->cpus_per_task << 48) ^
			((uint64_t) d->ntasks_per_node << 32) ^ d->min_nodes);
	h = coda_mix(h, d->num_tasks);
	h = coda_mix(h, d->sockets_per_node);
	for (i = 0; i < CODA_KEY_STRINGS; i++) {
		if (!s[i]) {
			len[i] = SIZE_MAX;
			h = coda_mix(h, ~(uint64_t) i);
			continue;
		}
		n = len[i] = strlen(s[i]);
		h = coda_mix(h, n ^ ((uint64_t) i << 56));
		for (j = 0; j + 8 <= n; j += 8) {
			memcpy(&w, s[i] + j, 8);
			h = coda_mix(h, w);
		}
		if (j < n) {
			w = 0;
			memcpy(&w, s[i] + j, n - j);
			h = coda_mix(h, w);
		}
	}
	return h;
}

static int coda_key_equal(const struct coda_memo_entry *e, const job_desc_msg_t *d,
			  uint32_t uid, const char *s[CODA_KEY_STRINGS],
			  const size_t len[CODA_KEY_STRINGS])
{
	size_t i;

	if (e->uid != uid || e->cpus_per_task != d->cpus_per_task ||
	    e->ntasks_per_node != d->ntasks_per_node ||
	    e->sockets_per_node != d->sockets_per_node ||
	    e->min_nodes != d->min_nodes || e->num_tasks != d->num_tasks)
		return 0;
	for (i = 0; i < CODA_KEY_STRINGS; i++) {
		if (e->key_len[i] != len[i])
			return 0;
		if (len[i] != SIZE_MAX && memcmp(e->key[i], s[i], len[i]) != 0)
			return 0;
	}
	return 1;
}

/* The slot holding this key, or the empty slot where it would go. */
static struct coda_memo_entry **coda_memo_slot(uint64_t h, const job_desc_msg_t *d,
					       uint32_t uid, const char *s[],
					       const size_t len[])
{
	size_t i = h & (CODA_MEMO_SLOTS - 1);
	struct coda_memo_entry *e;

	/* Never more than half full, so an empty slot always ends the probe. */
	while ((e = coda_memo.slot[i])) {
		if (e->hash == h && coda_key_equal(e, d, uid, s, len))
			break;
		i = (i + 1) & (CODA_MEMO_SLOTS - 1);
	}
	return &coda_memo.slot[i];
}

static void coda_memo_free_entry(struct coda_memo_entry *e)
{
	size_t i;

	for (i = 0; i < CODA_KEY_STRINGS; i++)
		free(e->key[i]);
	free(e->cpus_per_tres);
	free(e->tres_per_node);
	free(e->prefer);
	free(e->partition);
	free(e->admin_comment);
	free(e->admin_note);
	free(e->user_msg);
	free(e->log_line);
	free(e);
}

static void coda_memo_free_table(struct coda_memo_entry **slot)
{
	size_t i;

	if (!slot)
		return;
	for (i = 0; i < CODA_MEMO_SLOTS; i++)
		if (slot[i])
			coda_memo_free_entry(slot[i]);
	free(slot);
}

static int64_t coda_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Decision tokens.  Every decision that writes an admin record ends the record
 * with ";tok=<16 hex digits>", unique to that submission, so that coda-slurm
 * status can tell the decisions Slurm kept (a job whose record holds the token)
 * from those of submissions slurmctld refused after job_submit (the job id is
 * not known here).  A token is the wall clock in nanoseconds, or one more than
 * the last token when the clock has not moved on: increasing within a slurmctld,
 * and above every token an earlier slurmctld handed out unless the clock went
 * back.  Under coda_memo.lock.
 */
static uint64_t coda_token_locked(int64_t unix_ns)
{
	uint64_t now = unix_ns > 0 ? (uint64_t) unix_ns : 0;

	coda_memo.last_token = now > coda_memo.last_token ? now : coda_memo.last_token + 1;
	return coda_memo.last_token;
}

/* Called from Python: the token of a decision Python applies itself. */
static uint64_t coda_next_token(void)
{
	uint64_t token;

	pthread_mutex_lock(&coda_memo.lock);
	token = coda_token_locked(coda_ns(CLOCK_REALTIME));
	pthread_mutex_unlock(&coda_memo.lock);
	return token;
}

/* *slot = *slot + sep + value, or value alone when *slot is NULL or empty (as
 * hook.py appends to admin_comment and to the message for sbatch). */
static void coda_append_str(char **slot, const char *sep, const char *value)
{
	size_t a, b, c;
	char *joined;

	if (!*slot || !**slot) {
		coda_replace_str(slot, value);
		return;
	}
	a = strlen(*slot);
	b = strlen(sep);
	c = strlen(value);
	joined = malloc(a + b + c + 1);
	if (!joined)
		return; /* keep what is there rather than lose it */
	memcpy(joined, *slot, a);
	memcpy(joined + a, sep, b);
	memcpy(joined + a + b, value, c + 1);
	coda_replace_str(slot, joined);
	free(joined);
}

/* Append the admin record with its token, and the user's line after it, as
 * hook.py's _apply() does: *slot + " " + record + ";tok=" + 16 hex digits
 * [+ " " + note] (no leading blank when *slot is empty).  One buffer, no
 * printf: this runs for every replayed job. */
static void coda_append_record(char **slot, const char *record, uint64_t token,
			       const char *note)
{
	static const char hex[] = "0123456789abcdef";
	size_t a = *slot ? strlen(*slot) : 0, b = strlen(record);
	size_t c = note ? strlen(note) : 0;
	char *joined = malloc(a + 1 + b + 5 + 16 + 1 + c + 1), *o;
	int i;

	if (!joined)
		return; /* keep what is there rather than lose it */
	o = joined;
	if (a) {
		memcpy(o, *slot, a);
		o += a;
		*o++ = ' ';
	}
	memcpy(o, record, b);
	o += b;
	memcpy(o, ";tok=", 5);
	o += 5;
	for (i = 15; i >= 0; i--, token >>= 4)
		o[i] = hex[token & 0xf];
	o += 16;
	if (note) {
		*o++ = ' ';
		memcpy(o, note, c);
		o += c;
	}
	*o = '\0';
	coda_replace_str(slot, joined);
	free(joined);
}

/* Apply a remembered plan exactly as hook.py's _apply() would. */
static void coda_memo_apply(const struct coda_memo_entry *e, job_desc_msg_t *d,
			    char **err_msg, uint64_t token)
{
	if (e->cpus_per_tres)
		coda_replace_str(&d->cpus_per_tres, e->cpus_per_tres);
	if (e->cpus_per_task_now)
		coda_set_cpus_per_task(d, e->cpus_per_task_now);
	if (e->cpg_was)
		coda_rescale_min_cpus(d, e->cpg_was, e->cpg_now);
	if (e->tres_per_node)
		coda_replace_str(&d->tres_per_node, e->tres_per_node);
	if (e->prefer)
		coda_replace_str(&d->prefer, e->prefer);
	if (e->partition)
		coda_replace_str(&d->partition, e->partition);
	if (e->admin_comment)
		coda_append_record(&d->admin_comment, e->admin_comment, token,
				   e->admin_note);
	if (e->user_msg)
		coda_append_str(err_msg, "\n", e->user_msg);
	if (e->log_level >= 0)
		coda_log(e->log_level, e->log_line);
}

/* Answer the job from the table. 1: answered (and recorded); 0: ask Python. */
static int coda_replay(job_desc_msg_t *d, uint32_t submit_uid, char **err_msg)
{
	int64_t t0 = coda_ns(CLOCK_MONOTONIC), plan_id, unix_ns = 0;
	uint64_t token = 0;
	const char *s[CODA_KEY_STRINGS];
	size_t len[CODA_KEY_STRINGS];
	struct coda_memo_entry *e;
	coda_replay_t *r;
	uint32_t uid;
	uint64_t h;

	pthread_mutex_lock(&coda_memo.lock);
	if (!coda_memo.enabled || coda_memo.ring_count == CODA_RING_RECORDS)
		goto ask_python;
	if (coda_memo.cpu_jobs_silent && !d->tres_per_node && !d->tres_per_job &&
	    !d->tres_per_task && !d->tres_per_socket) {
		plan_id = 0; /* what hook.py does too: nothing to write or say */
	} else {
		if (!coda_memo.slot)
			goto ask_python;
		uid = d->user_id != NO_VAL ? d->user_id : submit_uid;
		coda_key_strings(d, s);
		h = coda_key_hash(d, uid, s, len);
		e = *coda_memo_slot(h, d, uid, s, len);
		if (!e)
			goto ask_python;
		unix_ns = coda_ns(CLOCK_REALTIME);
		if (e->admin_comment)
			token = coda_token_locked(unix_ns);
		coda_memo_apply(e, d, err_msg, token);
		plan_id = e->plan_id;
	}
	r = &coda_memo.ring[(coda_memo.ring_head + coda_memo.ring_count) %
			    CODA_RING_RECORDS];
	r->plan_id = plan_id;
	r->job_id = CODA_JOB_ID(d);
	r->token = token;
	r->unix_ns = unix_ns ? unix_ns : coda_ns(CLOCK_REALTIME);
	r->elapsed_ns = coda_ns(CLOCK_MONOTONIC) - t0;
	coda_memo.ring_count++;
	pthread_mutex_unlock(&coda_memo.lock);
	return 1;

ask_python:
	pthread_mutex_unlock(&coda_memo.lock);
	return 0;
}

/* Called from Python: empty the table and start a new generation (returned).
 * enabled=0 stops replaying until the next reset. */
static int64_t coda_memo_reset(int enabled, int cpu_jobs_silent)
{
	struct coda_memo_entry **old;
	int64_t gen;

	pthread_mutex_lock(&coda_memo.lock);
	old = coda_memo.slot;
	coda_memo.slot = NULL;
	coda_memo.entries = 0;
	coda_memo.key_bytes = 0;
	coda_memo.enabled = enabled;
	coda_memo.cpu_jobs_silent = cpu_jobs_silent;
	gen = ++coda_memo.gen;
	pthread_mutex_unlock(&coda_memo.lock);
	coda_memo_free_table(old); /* outside the lock: a submission need not wait */
	return gen;
}

static char *coda_dup_opt(const char *value, int *failed)
{
	char *copy;

	if (!value)
		return NULL;
	copy = strdup(value);
	if (!copy)
		*failed = 1;
	return copy;
}

/* Called from Python, before the plan is applied (job_desc still as submitted):
 * remember the plan for jobs with this job's key.  Returns 1 when stored, 2 when
 * stored after emptying a full table (plans stored before it are gone), 3 when
 * a plan for this key is already there (kept), 0 when refused (an old
 * generation, replay off, a key over the byte bound, no memory). */
static int coda_memo_put(job_desc_msg_t *d, uint32_t submit_uid, int64_t gen,
			 int64_t plan_id, uint16_t cpus_per_task_now, uint32_t cpg_was,
			 uint32_t cpg_now, int log_level,
			 const char *cpus_per_tres, const char *tres_per_node,
			 const char *prefer, const char *partition,
			 const char *admin_comment, const char *admin_note,
			 const char *user_msg, const char *log_line)
{
	const char *s[CODA_KEY_STRINGS];
	size_t len[CODA_KEY_STRINGS], key_bytes = 0, i;
	struct coda_memo_entry *e, **slot, **full = NULL;
	int failed = 0, rc = 1;
	uint32_t uid = d->user_id != NO_VAL ? d->user_id : submit_uid;
	uint64_t h;

	coda_key_strings(d, s);
	h = coda_key_hash(d, uid, s, len);
	for (i = 0; i < CODA_KEY_STRINGS; i++)
		if (len[i] != SIZE_MAX)
			key_bytes += len[i];
	if (key_bytes > CODA_MEMO_MAX_KEY_BYTES)
		return 0;

	/* Copy everything before taking the lock. */
	e = calloc(1, sizeof(*e));
	if (!e)
		return 0;
	e->hash = h;
	e->uid = uid;
	e->cpus_per_task = d->cpus_per_task;
	e->ntasks_per_node = d->ntasks_per_node;
	e->sockets_per_node = d->sockets_per_node;
	e->min_nodes = d->min_nodes;
	e->num_tasks = d->num_tasks;
	for (i = 0; i < CODA_KEY_STRINGS; i++) {
		e->key_len[i] = len[i];
		if (len[i] == SIZE_MAX)
			continue;
		e->key[i] = malloc(len[i] + 1);
		if (!e->key[i]) {
			failed = 1;
			continue;
		}
		memcpy(e->key[i], s[i], len[i] + 1);
	}
	e->key_bytes = key_bytes;
	e->plan_id = plan_id;
	e->cpus_per_task_now = cpus_per_task_now;
	e->cpg_was = cpg_was;
	e->cpg_now = cpg_now;
	e->log_level = log_level;
	e->cpus_per_tres = coda_dup_opt(cpus_per_tres, &failed);
	e->tres_per_node = coda_dup_opt(tres_per_node, &failed);
	e->prefer = coda_dup_opt(prefer, &failed);
	e->partition = coda_dup_opt(partition, &failed);
	e->admin_comment = coda_dup_opt(admin_comment, &failed);
	e->admin_note = coda_dup_opt(admin_note, &failed);
	e->user_msg = coda_dup_opt(user_msg, &failed);
	e->log_line = coda_dup_opt(log_line ? log_line : "", &failed);
	if (failed) {
		coda_memo_free_entry(e);
		return 0;
	}

	pthread_mutex_lock(&coda_memo.lock);
	if (!coda_memo.enabled || gen != coda_memo.gen) {
		pthread_mutex_unlock(&coda_memo.lock);
		coda_memo_free_entry(e);
		return 0;
	}
	if (coda_memo.entries >= CODA_MEMO_MAX_ENTRIES ||
	    coda_memo.key_bytes + key_bytes > CODA_MEMO_MAX_KEY_BYTES) {
		full = coda_memo.slot; /* emptied, as DecisionMemo does */
		coda_memo.slot = NULL;
		coda_memo.entries = 0;
		coda_memo.key_bytes = 0;
		rc = 2;
	}
	if (!coda_memo.slot) {
		coda_memo.slot = calloc(CODA_MEMO_SLOTS, sizeof(*coda_memo.slot));
		if (!coda_memo.slot) {
			pthread_mutex_unlock(&coda_memo.lock);
			coda_memo_free_entry(e);
			coda_memo_free_table(full);
			return 0;
		}
	}
	slot = coda_memo_slot(h, d, uid, s, len);
	if (*slot) {
		coda_memo_free_entry(e); /* already there: the same plan */
		rc = 3;
	} else {
		*slot = e;
		coda_memo.entries++;
		coda_memo.key_bytes += key_bytes;
	}
	pthread_mutex_unlock(&coda_memo.lock);
	coda_memo_free_table(full);
	return rc;
}

/* Called from Python: move up to max records of replayed jobs into out. */
static int coda_memo_drain(coda_replay_t *out, int max)
{
	int n, i;

	pthread_mutex_lock(&coda_memo.lock);
	n = (int) coda_memo.ring_count < max ? (int) coda_memo.ring_count : max;
	for (i = 0; i < n; i++)
		out[i] = coda_memo.ring[(coda_memo.ring_head + i) % CODA_RING_RECORDS];
	coda_memo.ring_head = (coda_memo.ring_head + n) % CODA_RING_RECORDS;
	coda_memo.ring_count -= n;
	pthread_mutex_unlock(&coda_memo.lock);
	return n;
}

/* Log a multi-line text (a Python traceback) one line at a time. */
static void coda_log_lines(int level, const char *text)
{
	char *copy, *line, *save = NULL;

	if (!text || !*text)
		return;
	copy = strdup(text);
	if (!copy)
		return;
	for (line = strtok_r(copy, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save))
		coda_log(level, line);
	free(copy);
}

/* Run a snippet of Python in __main__ and return str(result of `expr`) (malloc'd)
 * or, on an exception, the formatted exception (and *failed = 1). */
static char *coda_run_python(const char *code, const char *expr, int *failed)
{
	PyObject *main_mod, *globals, *res = NULL, *str = NULL;
	PyObject *etype = NULL, *evalue = NULL, *etb = NULL;
	char *out = NULL;
	const char *utf8;

	*failed = 0;
	main_mod = PyImport_AddModule("__main__");
	if (!main_mod)
		goto error;
	globals = PyModule_GetDict(main_mod);
	if (code) {
		res = PyRun_String(code, Py_file_input, globals, globals);
		if (!res)
			goto error;
		Py_DECREF(res);
		res = NULL;
	}
	if (expr) {
		res = PyRun_String(expr, Py_eval_input, globals, globals);
		if (!res)
			goto error;
		str = PyObject_Str(res);
		if (!str)
			goto error;
		utf8 = PyUnicode_AsUTF8(str);
		out = strdup(utf8 ? utf8 : "");
	}
	Py_XDECREF(res);
	Py_XDECREF(str);
	return out;

error:
	*failed = 1;
	Py_XDECREF(res);
	Py_XDECREF(str);
	PyErr_Fetch(&etype, &evalue, &etb);
	PyErr_NormalizeException(&etype, &evalue, &etb);
	if (evalue) {
		str = PyObject_Str(evalue);
		utf8 = str ? PyUnicode_AsUTF8(str) : NULL;
		if (utf8) {
			size_t n = strlen(utf8) + 128;
			out = malloc(n);
			if (out)
				snprintf(out, n, "%s: %s",
					 ((PyTypeObject *) etype)->tp_name, utf8);
		}
		Py_XDECREF(str);
	}
	PyErr_Clear();
	Py_XDECREF(etype);
	Py_XDECREF(evalue);
	Py_XDECREF(etb);
	if (!out)
		out = strdup("unknown Python error");
	return out;
}

static int coda_start(void);

extern int init(void)
{
	if (coda_start() == 0) {
		coda_active = 1;
	} else {
		coda_active = 0;
		slurm_error("job_submit/coda: INACTIVE: every job passes unchanged "
			    "(see the lines above for why; fix and restart slurmctld)");
	}
	return SLURM_SUCCESS;
}

extern int fini(void)
{
	if (coda_active)
		coda_py_fini();
	coda_active = 0;
	coda_memo_reset(0, 0);
	return SLURM_SUCCESS;
}

extern int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid,
		      char **err_msg)
{
	if (!coda_active)
		return SLURM_SUCCESS;
	if (coda_replay(job_desc, submit_uid, err_msg))
		return SLURM_SUCCESS;
	return coda_py_submit(job_desc, submit_uid, err_msg);
}

extern int job_modify(job_desc_msg_t *job_desc, void *job_ptr,
		      uint32_t submit_uid, char **err_msg)
{
	(void) job_ptr; /* job_record_t is slurmctld-internal; we do not read it */
	if (!coda_active)
		return SLURM_SUCCESS;
	return coda_py_modify(job_desc, submit_uid, err_msg);
}

/*
 * Start Python inside slurmctld.  Returns 0 when the hook is ready.
 *
 * 1. slurmctld dlopen()s plugins with RTLD_LOCAL, so libpython's symbols (pulled
 *    in as our DT_NEEDED) are not visible to the extension modules Python loads
 *    later (they fail with "undefined symbol: PyExc_SystemError").  Re-open
 *    libpython with RTLD_NOLOAD|RTLD_GLOBAL to promote it to global scope.
 * 2. Initialise the interpreter ourselves (no signal handlers: slurmctld owns
 *    them), add the site directories the package was installed into, and
 *    capture sys.stderr so that cffi's start-up errors reach slurmctld's log
 *    instead of a stderr nobody reads.
 * 3. Let cffi run the embedding init code (imports slurm_plugin.hook.submit) and call
 *    the hook's own init, which loads coda.conf and the profile store.
 */
static int coda_start(void)
{
	PyGILState_STATE gil;
	char *msg;
	int failed = 0, rc;

	if (!dlopen(CODA_LIBPYTHON, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
		slurm_error("job_submit/coda: cannot promote %s to global symbol "
			    "scope: %s", CODA_LIBPYTHON, dlerror());
		return -1;
	}
	if (!Py_IsInitialized()) {
		/* Py_InitializeFromConfig reports failure (a bad PYTHONHOME, a
		 * missing stdlib) as a status instead of calling exit() inside
		 * slurmctld, as Py_InitializeEx would. */
		PyConfig config;
		PyStatus status;

		PyConfig_InitPythonConfig(&config);
		config.install_signal_handlers = 0; /* slurmctld owns signals */
		config.parse_argv = 0;
		status = Py_InitializeFromConfig(&config);
		PyConfig_Clear(&config);
		if (PyStatus_Exception(status)) {
			slurm_error("job_submit/coda: cannot start Python %s: %s%s%s",
				    Py_GetVersion(),
				    status.func ? status.func : "",
				    status.func ? ": " : "",
				    status.err_msg ? status.err_msg : "unknown error");
			return -1;
		}
		PyEval_SaveThread(); /* release the GIL taken by initialisation */
	}

	gil = PyGILState_Ensure();
	msg = coda_run_python(CODA_BOOTSTRAP, NULL, &failed);
	PyGILState_Release(gil);
	if (failed) {
		slurm_error("job_submit/coda: Python bootstrap failed: %s",
			    msg ? msg : "?");
		free(msg);
		return -1;
	}
	free(msg);

	rc = cffi_start_python();

	gil = PyGILState_Ensure();
	msg = coda_run_python(
		NULL, "_coda_restore_stderr()", &failed);
	PyGILState_Release(gil);
	if (rc != 0) {
		slurm_error("job_submit/coda: embedded Python failed to start "
			    "(python %s, sys.path from the install at build time)",
			    Py_GetVersion());
		coda_log_lines(CODA_LOG_ERROR, msg);
		free(msg);
		return -1;
	}
	free(msg);

	rc = coda_py_init();
	if (rc != 1) {
		/* coda_py_init logged its reason itself; rc 0 also means cffi
		 * could not call it at all. */
		return -1;
	}
	return 0;
}
