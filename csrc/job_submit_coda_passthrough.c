/*
 * job_submit/coda, passthrough: a job_submit plugin that accepts every job unchanged.
 *
 * `coda-slurm plugin guard` installs this in place of the real job_submit_coda.so when
 * the real one cannot be built for the Slurm that is about to start (a Slurm or Python
 * upgrade without the headers or compiler to rebuild).  slurmctld exits on a job_submit
 * plugin it names but cannot load; coda fails open by design, so a Slurm that schedules
 * without coda's changes is the safe state.
 *
 * It includes no Slurm header and touches no Slurm structure, so one binary fits every
 * Slurm release.  The loader (src/common/plugin.c) needs plugin_name, plugin_type and
 * plugin_version; src/slurmctld/job_submit.c needs job_submit and job_modify; init and
 * fini are called when present.  plugin_version must equal the running slurmctld's
 * SLURM_VERSION_NUMBER, micro release included: the guard writes it into the file, at
 * the offset of the plugin_version symbol, and writes why coda is bypassed into
 * coda_bypass_reason.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#define CODA_SUCCESS 0 /* SLURM_SUCCESS */

const char plugin_name[] = "CODA passthrough: jobs are not changed by coda";
const char plugin_type[] = "job_submit/coda";
/* Not a Slurm version: the guard replaces it with the running slurmctld's. */
const uint32_t plugin_version = 0xc0da0000;

/* The guard finds a passthrough by this symbol (and rebuilds the real plugin again at
 * the next start). */
const uint32_t coda_passthrough = 1;

/* Replaced by the guard (NUL-padded, same size) with what was missing and how to fix it.
 * Like plugin_version it is read from the file at run time: in a -fPIC object an exported
 * symbol may be interposed, so the compiler never folds its initializer into the code. */
const char coda_bypass_reason[1024] =
	"the real plugin could not be built for this Slurm; jobs are not changed by coda. "
	"Fix: install libslurm-dev, python3-dev, python3-cffi and gcc for this Slurm and run "
	"`coda-slurm plugin guard`, then restart slurmctld";

typedef void (*coda_log_fn)(const char *fmt, ...);

int init(void)
{
	/* slurmctld's own logger, found at run time: linking libslurm would tie this file
	 * to one Slurm release. */
	coda_log_fn log_error = (coda_log_fn) dlsym(RTLD_DEFAULT, "slurm_error");

	if (log_error)
		log_error("job_submit/coda: passthrough: %s", coda_bypass_reason);
	else
		fprintf(stderr, "job_submit/coda: passthrough: %s\n", coda_bypass_reason);
	return CODA_SUCCESS;
}

int fini(void)
{
	return CODA_SUCCESS;
}

int job_submit(void *job_desc, uint32_t submit_uid, char **err_msg)
{
	(void) job_desc;
	(void) submit_uid;
	(void) err_msg;
	return CODA_SUCCESS;
}

int job_modify(void *job_desc, void *job_ptr, uint32_t submit_uid, char **err_msg)
{
	(void) job_desc;
	(void) job_ptr;
	(void) submit_uid;
	(void) err_msg;
	return CODA_SUCCESS;
}
