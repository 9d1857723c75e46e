/*
 * job_submit/coda: the C face of a Slurm job_submit plugin whose logic is Python.
 *
 * This file is compiled by cffi in embedding mode (csrc/build_plugin.py) into
 * job_submit_coda.so.  It only does what must happen in C:
 *   - the plugin symbols slurmctld looks for (plugin_name/type/version, init, fini,
 *     job_submit, job_modify);
 *   - starting the embedded interpreter safely inside slurmctld;
 *   - the helpers Python calls back: logging into slurmctld's log, replacing a
 *     string field of job_desc with memory from Slurm's own allocator, moving
 *     the fields sbatch derived from a rewritten -c or --cpus-per-gpu, and the
 *     decision tokens.
 * Every decision is made, and every job_desc write is chosen, in
 * slurm_plugin/hook/submit.py.
 *
 * Failure policy: nothing in here may stop slurmctld from scheduling.  If Python
 * cannot start, init() logs why at error level and still returns SLURM_SUCCESS;
 * job_submit()/job_modify() then accept every job unchanged.
 */
#include <dlfcn.h>
#include <errno.h>
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

/* Called from Python when coda rewrites the user's -c to NOW CPUs per task: -c
 * and all sbatch derived from it (src/sbatch/opt.c raises pn_min_cpus to it;
 * min_cpus is tasks x -c; from 23.11 tres_per_task carries cpu=N) move together,
 * so Slurm gives every task NOW CPUs and says so in SLURM_CPUS_PER_TASK.  A larger --mincpus of the user's own is kept.  Nothing
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

/* Called from Python when the user's --cpus-per-gpu=WAS is rewritten to NOW:
 * sbatch from 23.11 on sends min_cpus = WAS x GPUs, and Slurm refuses a job
 * whose min_cpus its new --cpus-per-gpu cannot give.  Any other
 * min_cpus (22.05 sends the task count) is left as it is. */
static void coda_rescale_min_cpus(job_desc_msg_t *d, uint32_t was, uint32_t now)
{
	if (!was || !now || d->min_cpus == NO_VAL || d->min_cpus < was ||
	    d->min_cpus % was)
		return;
	d->min_cpus = d->min_cpus / was * now;
}

/*
 * The job as slurmctld holds it, through libslurm's public API (slurm.h), for the
 * re-decision of a pending job an update changed (slurm_plugin/hook/modify.py).
 * job_modify() cannot read job_ptr (job_record_t is slurmctld-internal), so a worker
 * thread holding none of slurmctld's locks asks slurmctld by RPC.  Called with the GIL
 * released (cffi releases it around every call); each returns 0 or Slurm's errno.
 *
 * The API is looked up when called (slurmctld's libslurmfull exports it), not linked:
 * the module still loads where it is absent (in-process tests), and the calls then
 * return ENOSYS.  __typeof__ keeps each pointer's type slurm.h's own.
 */
#ifndef RTLD_DEFAULT
#define RTLD_DEFAULT ((void *) 0)
#endif
#define CODA_API(name) ((__typeof__(&name)) dlsym(RTLD_DEFAULT, #name))

/* Read job JOB_ID into *out (free it with coda_job_free). */
static int coda_job_load(uint32_t job_id, job_info_msg_t **out)
{
	__typeof__(&slurm_load_job) load = CODA_API(slurm_load_job);
	int rc;

	*out = NULL;
	if (!load)
		return ENOSYS;
	errno = 0;
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(26, 5, 0)
	{
		slurm_step_id_t step_id = SLURM_STEP_ID_INITIALIZER;

		step_id.job_id = job_id;
		rc = load(out, step_id, SHOW_ALL);
	}
#else
	rc = load(out, job_id, SHOW_ALL);
#endif
	if (rc != SLURM_SUCCESS) {
		*out = NULL;
		return errno ? errno : SLURM_ERROR;
	}
	return 0;
}

static void coda_job_free(job_info_msg_t *msg)
{
	__typeof__(&slurm_free_job_info_msg) release =
		CODA_API(slurm_free_job_info_msg);

	if (msg && release)
		release(msg);
}

/* Set job JOB_ID's cpus_per_tres ("" clears it), admin comment and, unless it is
 * NO_VAL, its minimum CPU count. */
static int coda_job_update(uint32_t job_id, const char *cpus_per_tres,
			   const char *admin_comment, uint32_t min_cpus)
{
	__typeof__(&slurm_init_job_desc_msg) init_desc =
		CODA_API(slurm_init_job_desc_msg);
	__typeof__(&slurm_update_job) update = CODA_API(slurm_update_job);
	job_desc_msg_t desc;

	if (!init_desc || !update)
		return ENOSYS;
	init_desc(&desc);
	CODA_JOB_ID(&desc) = job_id;
	desc.cpus_per_tres = (char *) cpus_per_tres;
	desc.admin_comment = (char *) admin_comment;
	desc.min_cpus = min_cpus;
	errno = 0;
	if (update(&desc) == SLURM_SUCCESS)
		return 0;
	return errno ? errno : SLURM_ERROR;
}

/* Slurm's words for an errno of the calls above (a static string). */
static const char *coda_strerror(int rc)
{
	__typeof__(&slurm_strerror) words = CODA_API(slurm_strerror);

	if (rc == ENOSYS || !words)
		return rc == ENOSYS ? "libslurm's job API is not in this process" : "unknown error";
	return words(rc);
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
 * back.
 */
static pthread_mutex_t coda_token_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t coda_last_token;

/* Called from Python: the token of the decision it is about to apply. */
static uint64_t coda_next_token(void)
{
	uint64_t now, token;
	int64_t unix_ns = coda_ns(CLOCK_REALTIME);

	now = unix_ns > 0 ? (uint64_t) unix_ns : 0;
	pthread_mutex_lock(&coda_token_lock);
	coda_last_token = now > coda_last_token ? now : coda_last_token + 1;
	token = coda_last_token;
	pthread_mutex_unlock(&coda_token_lock);
	return token;
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

/*
 * Python's arena allocator, with a few freed blocks kept.
 *
 * slurmctld 22.05 serves each RPC on a thread of its own, so every job_submit()
 * call gives Python a new thread state, and its first frame a new data stack
 * chunk (16 KiB) from the arena allocator: an mmap(), page faults on first use,
 * and an munmap() when the thread state is deleted.  Keeping up to
 * CODA_ARENA_KEEP freed blocks of at most CODA_ARENA_KEEP_BYTES and handing one
 * back to the next request of the same size takes that off every call
 * (docs/benchmarks.md, "Where a never-seen job's time goes").  pymalloc's own
 * arenas are larger and always go to the allocator Python had.
 *
 * A kept block is a block that allocator gave out for that size, so every block
 * is freed by it in the end; nothing in CPython may count on fresh blocks being
 * zeroed, since its default allocator is malloc() where there is no mmap().
 * Blocks are freed with or without the GIL (PyThreadState_Delete needs none),
 * hence the mutex.  fini() puts Python's allocator back, so nothing in Python
 * calls into this object once slurmctld unloads it.
 */
#ifndef CODA_ARENA_KEEP /* -DCODA_ARENA_KEEP=0: keep none (bench_submit_paths.py) */
#define CODA_ARENA_KEEP 4
#endif
#define CODA_ARENA_KEEP_BYTES ((size_t) 64 << 10)

static struct {
	pthread_mutex_t lock;
	PyObjectArenaAllocator python; /* the allocator Python had */
	int installed;
	unsigned n;
	void *block[CODA_ARENA_KEEP > 0 ? CODA_ARENA_KEEP : 1];
	size_t size[CODA_ARENA_KEEP > 0 ? CODA_ARENA_KEEP : 1];
} coda_arena = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void *coda_arena_alloc(void *ctx, size_t size)
{
	void *p = NULL;
	unsigned i;

	(void) ctx;
	pthread_mutex_lock(&coda_arena.lock);
	for (i = 0; i < coda_arena.n; i++) {
		if (coda_arena.size[i] == size) {
			p = coda_arena.block[i];
			coda_arena.n--;
			coda_arena.block[i] = coda_arena.block[coda_arena.n];
			coda_arena.size[i] = coda_arena.size[coda_arena.n];
			break;
		}
	}
	pthread_mutex_unlock(&coda_arena.lock);
	if (p)
		return p;
	return coda_arena.python.alloc(coda_arena.python.ctx, size);
}

static void coda_arena_free(void *ctx, void *p, size_t size)
{
	(void) ctx;
	if (size <= CODA_ARENA_KEEP_BYTES) {
		pthread_mutex_lock(&coda_arena.lock);
		if (coda_arena.n < CODA_ARENA_KEEP) {
			coda_arena.block[coda_arena.n] = p;
			coda_arena.size[coda_arena.n] = size;
			coda_arena.n++;
			p = NULL;
		}
		pthread_mutex_unlock(&coda_arena.lock);
		if (!p)
			return;
	}
	coda_arena.python.free(coda_arena.python.ctx, p, size);
}

/* With the GIL held. */
static void coda_arena_install(void)
{
	PyObjectArenaAllocator mine = { NULL, coda_arena_alloc, coda_arena_free };

	if (coda_arena.installed)
		return;
	PyObject_GetArenaAllocator(&coda_arena.python);
	PyObject_SetArenaAllocator(&mine);
	coda_arena.installed = 1;
}

/* With the GIL held: Python's allocator back, and the kept blocks to it. */
static void coda_arena_remove(void)
{
	unsigned i;

	if (!coda_arena.installed)
		return;
	PyObject_SetArenaAllocator(&coda_arena.python);
	coda_arena.installed = 0;
	pthread_mutex_lock(&coda_arena.lock);
	for (i = 0; i < coda_arena.n; i++)
		coda_arena.python.free(coda_arena.python.ctx, coda_arena.block[i],
				       coda_arena.size[i]);
	coda_arena.n = 0;
	pthread_mutex_unlock(&coda_arena.lock);
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
	PyGILState_STATE gil;

	if (coda_active)
		coda_py_fini();
	coda_active = 0;
	if (coda_arena.installed) {
		gil = PyGILState_Ensure();
		coda_arena_remove();
		PyGILState_Release(gil);
	}
	return SLURM_SUCCESS;
}

extern int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid,
		      char **err_msg)
{
	if (!coda_active)
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
 *    them), keep freed stack chunks for the next RPC thread (coda_arena), add
 *    the site directories the package was installed into, and capture
 *    sys.stderr so that cffi's start-up errors reach slurmctld's log instead of
 *    a stderr nobody reads.
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
	coda_arena_install();
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
