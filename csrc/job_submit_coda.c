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
 * Every decision is made in slurm_plugin/hook.py.
 *
 * Failure policy: nothing in here may stop slurmctld from scheduling.  If Python
 * cannot start, init() logs why at error level and still returns SLURM_SUCCESS;
 * job_submit()/job_modify() then accept every job unchanged.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* 1 once Python is running and slurm_plugin.hook is loaded. */
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
 *    them), add the site directories the package was installed into, and
 *    capture sys.stderr so that cffi's start-up errors reach slurmctld's log
 *    instead of a stderr nobody reads.
 * 3. Let cffi run the embedding init code (imports slurm_plugin.hook) and call
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
