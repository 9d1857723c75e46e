/*
 * coda_node._perf: thin syscall wrappers over perf_event_open(2).
 *
 * This file only makes syscalls and returns raw numbers or -errno, as psutil's
 * _psutil_linux.c does; PMU discovery, event encoding, unit scaling and the
 * multiplexing / wrap arithmetic live in coda_node/system/perf.py.
 *
 * Every counter is opened with
 *   read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
 * so one read(2) returns { u64 value; u64 time_enabled; u64 time_running; }
 * (see "Reading results" in perf_event_open(2) and the read_format comment in
 * include/uapi/linux/perf_event.h).
 */

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/perf_event.h>

#define CODA_PERF_READ_WORDS 3

static int coda_perf_open(uint32_t type, uint64_t config, uint64_t config1, uint64_t config2,
                          int pid, int cpu, int group_fd, int disabled, int inherit)
{
    struct perf_event_attr attr;
    long fd;

    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = type;
    attr.config = config;
    attr.config1 = config1;
    attr.config2 = config2;
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
    attr.disabled = disabled ? 1 : 0;
    attr.inherit = inherit ? 1 : 0;
    /* glibc has no wrapper for perf_event_open. */
    fd = syscall(SYS_perf_event_open, &attr, (pid_t)pid, cpu, group_fd,
                 (unsigned long)PERF_FLAG_FD_CLOEXEC);
    if (fd < 0)
        return -errno;
    return (int)fd;
}

static int read_one(int fd, uint64_t *words)
{
    ssize_t n;

    do {
        n = read(fd, words, CODA_PERF_READ_WORDS * sizeof(uint64_t));
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    if (n != (ssize_t)(CODA_PERF_READ_WORDS * sizeof(uint64_t)))
        return -EIO;
    return 0;
}

static int coda_perf_read(int fd, uint64_t *value, uint64_t *time_enabled_ns,
                          uint64_t *time_running_ns)
{
    uint64_t words[CODA_PERF_READ_WORDS];
    int rc = read_one(fd, words);

    if (rc < 0)
        return rc;
    *value = words[0];
    *time_enabled_ns = words[1];
    *time_running_ns = words[2];
    return 0;
}

/* Several counters in one FFI crossing: out holds 3*n words, in fds order. */
static int coda_perf_read_many(int n, const int *fds, uint64_t *out)
{
    int i;
    int rc;

    if (n < 0)
        return -EINVAL;
    for (i = 0; i < n; i++) {
        rc = read_one(fds[i], out + (size_t)i * CODA_PERF_READ_WORDS);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int do_ioctl(int fd, unsigned long request)
{
    if (ioctl(fd, request, 0) < 0)
        return -errno;
    return 0;
}

static int coda_perf_enable(int fd)
{
    return do_ioctl(fd, PERF_EVENT_IOC_ENABLE);
}

static int coda_perf_disable(int fd)
{
    return do_ioctl(fd, PERF_EVENT_IOC_DISABLE);
}

static int coda_perf_reset(int fd)
{
    return do_ioctl(fd, PERF_EVENT_IOC_RESET);
}

static int coda_perf_close(int fd)
{
    /* No retry on EINTR: Linux has released the descriptor either way (close(2)). */
    if (close(fd) < 0)
        return -errno;
    return 0;
}
