/* The run-time half of a task's `forbid` list for CUDA API calls: a library that subscribes to
 * CUPTI's callbacks for the runtime and driver API functions the task forbids, and ends the
 * process when the solution calls one of them, however it found the function's address (its
 * name in the dynamic symbol table, dlsym, the library's file read from disk, a scan of memory:
 * CUPTI is told of every call of an API entry point).
 *
 * Generated per task by pytest_commbench/cupti_guard.py, which writes `commbench_cupti.h`:
 *
 *   #define COMMBENCH_CBIDS(X) X(CUPTI_CB_DOMAIN_DRIVER_API, 17, "cuMemcpyDtoD") ...
 *                                 domain, callback id, the function's name; sorted
 *   #define COMMBENCH_NCBID 1
 *   #define COMMBENCH_TRUSTED "libnccl.so*",     file-name globs of libraries whose own
 *                                                 forbidden calls are theirs, not the solution's
 *
 * The rank harness loads it and calls commbench_guard_cupti_arm(solution_path) (exported;
 * one-way) before it loads the solution: it subscribes to CUPTI, enables the forbidden
 * callbacks and makes its state page read-only. At the entry of a forbidden function the
 * callback walks the calling thread's stack (backtrace) and, looking outwards from the call:
 *   - walks past frames of the CUDA libraries (libcudart, libcuda, libcupti, this guard) and
 *     of the C runtime (libc, libstdc++, libgcc_s, libffi, the loader, ...);
 *   - a driver function called by libcudart is the runtime doing a runtime function's work
 *     (cudaMalloc calls cuMemAlloc): allowed there, the runtime function is judged by its own
 *     callback;
 *   - a frame of the solution (the loaded object whose path was given at arming) or in no
 *     loaded object at all (code written at run time) makes the call the solution's;
 *   - the first other frame is the caller: a trusted library's own call is allowed there; any
 *     other object (the interpreter, cupy, MPI) is the harness, and the walk goes on outwards:
 *     a solution frame further out is the solution driving harness code;
 *   - a walk that ends having seen only CUDA and C-runtime frames is the solution's too (a
 *     thread whose start routine, or a host function that, is the forbidden function).
 * The solution's call writes {"forbidden": "<function>", "detail": ...} to
 * $COMMBENCH_GUARD_REPORT (as it was when armed, "%r" replaced by the rank) and ends the process
 * with _exit(86), as the interposer does.
 *
 * commbench_guard_cupti_window(open) (exported): the harness opens the call window around each
 * call of the solution and closes it after; inside it no frame counts as the harness's (the
 * harness makes no CUDA call then), so a forbidden function reached through the interpreter,
 * cupy or a harness function the solution replaced is the solution's too.
 *
 * commbench_guard_cupti_check() (exported) proves the subscription still works: every
 * forbidden callback still enabled for the guard's subscriber, and a call of cuDriverGetVersion
 * (through the libcuda found at arming) seen by the guard's own callback. A guard switched off
 * (cuptiFinalize, cuptiUnsubscribe, cuptiEnableCallback/Domain) is reported as a forbidden use
 * of "cupti" and ends the process the same way.
 *
 * Limits: see the docstring of pytest_commbench/cupti_guard.py. x86-64 Linux, glibc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <pthread.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cupti.h>

#include "commbench_cupti.h"
#include "guard_report.h"

#define EXPORT __attribute__((visibility("default")))
#define GUARD_EXIT 86  /* a forbidden call (the interposer's and the audit hook's code) */
#define MAX_FRAMES 256
#define CANARY_DOMAIN CUPTI_CB_DOMAIN_DRIVER_API
#define CANARY_CBID CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion

/* -- the table -------------------------------------------------------------------------- */

struct forbidden {
    CUpti_CallbackDomain domain;
    CUpti_CallbackId cbid;
    const char *name;
};

#define ENTRY(domain, cbid, name) {domain, cbid, name},
static const struct forbidden table[COMMBENCH_NCBID + 1] = {COMMBENCH_CBIDS(ENTRY){0, 0, NULL}};
static const char *const trusted[] = {COMMBENCH_TRUSTED NULL};

/* The entry for (domain, cbid), or -1: the table is sorted by domain, then id. */
static int lookup(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    int lo = 0, hi = COMMBENCH_NCBID - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        long c = (long)domain - (long)table[mid].domain;
        if (c == 0)
            c = (long)cbid - (long)table[mid].cbid;
        if (c == 0)
            return mid;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return -1;
}

/* -- state: set when armed, then read-only ------------------------------------------------ */

/* glibc's struct dl_find_object (2.35+), with room to spare; looked up at run time so the
 * library still loads on an older glibc (dladdr1 is used there). */
struct find_object {
    unsigned long long flags;
    void *map_start;
    void *map_end;
    struct link_map *map;
    void *eh_frame;
    unsigned long long reserved[16];
};
typedef int (*find_object_fn)(void *, struct find_object *);
typedef int (*driver_version_fn)(int *);

struct state {
    int armed;
    CUpti_SubscriberHandle subscriber;
    struct link_map *own;        /* this guard's object */
    find_object_fn find_object;  /* _dl_find_object, or NULL */
    driver_version_fn canary;    /* libcuda's cuDriverGetVersion */
    int solution_stat;           /* whether solution_dev/ino are known */
    dev_t solution_dev;
    ino_t solution_ino;
    char solution[PATH_MAX];     /* as given to arm: the path the harness loads */
    char report[PATH_MAX];
};
#define STATE_BYTES ((sizeof(struct state) + 4095) & ~(size_t)4095)

static union {
    struct state s;
    char page[STATE_BYTES];
} guard_state __attribute__((aligned(4096)));
#define S guard_state.s

static void cupti_error(const char *what, CUptiResult r);

static struct link_map *solution_map;  /* found at the first frame of it (after it loads) */
/* The call window: set by the harness while the solution's call runs (between its gate and
 * its "done"), when the harness itself makes no CUDA call at all: a forbidden call then is
 * the solution's whoever seems to make it (the interpreter or cupy driven by the solution,
 * harness functions it replaced), unless a trusted library makes it on its own. */
static volatile int window;
static char arming;                    /* a spin lock around arming */
static __thread int checking, canary_seen;

/* -- output --------------------------------------------------------------------------------- */

static void put(int fd, const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(fd, text, n);
        if (w <= 0)
            return;
        text += w;
        n -= (size_t)w;
    }
}

/* Only what a JSON string may hold as is (the rest replaced by '?'). */
static void json_safe(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == '"' || *s == '\\' || (unsigned char)*s >= 0x7f)
            *s = '?';
}

static void base_name(char *out, size_t size, const struct link_map *map) {
    const char *name = map && map->l_name ? map->l_name : NULL;
    if (!map)
        snprintf(out, size, "%s", "code outside every loaded object");
    else if (!name || !name[0])
        snprintf(out, size, "%s", "the main program");
    else {
        const char *base = strrchr(name, '/');
        snprintf(out, size, "%s", base ? base + 1 : name);
    }
    json_safe(out);
}

__attribute__((noreturn)) static void report(const char *name, const char *detail) {
    char line[2048], safe_name[256], safe_detail[1536];
    snprintf(safe_name, sizeof safe_name, "%s", name);
    snprintf(safe_detail, sizeof safe_detail, "%s", detail);
    json_safe(safe_name);
    json_safe(safe_detail);
    snprintf(line, sizeof line, "{\"forbidden\": \"%s\", \"detail\": \"%s\"}\n", safe_name,
             safe_detail);
    if (S.report[0]) {
        int fd = open(S.report, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            put(fd, line);
            close(fd);
        }
    }
    put(2, "commbench guard: forbidden call: ");
    put(2, line);
    _exit(GUARD_EXIT);
}

/* -- whose frame ---------------------------------------------------------------------------- */

enum kind {
    DRIVER,    /* the driver and CUPTI (the API's entry and its callback), this guard */
    RUNTIME,   /* libcudart */
    PASS,      /* the C runtime */
    SOLUTION,
    TRUSTED,
    OTHER
};

static struct link_map *object_of(void *pc) {
    if (S.find_object) {
        struct find_object found;
        if (S.find_object(pc, &found) == 0)
            return found.map;
        return NULL;
    }
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1(pc, &info, (void **)&map, RTLD_DL_LINKMAP))
        return NULL;
    return map;
}

static int starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The CUDA libraries themselves (the API and its callbacks run inside them), and the C
 * runtime: code that calls what it is handed (a thread's start routine, a comparison
 * function, libffi's ffi_call), never a caller of its own. */
static const char *const driver[] = {"libcuda.so", "libcupti.so", "libnvidia-",
                                     "libcudadebugger.so", NULL};
static const char *const passed[] = {
    "libc.so", "libstdc++.so", "libgcc_s.so", "libm.so", "ld-linux", "libpthread.so",
    "libdl.so", "librt.so", "libffi.so", "linux-vdso.so", NULL};

static int is_solution(const char *name, const char *base) {
    if (!S.solution[0] || !name[0])
        return 0;
    if (strcmp(name, S.solution) == 0)
        return 1;
    const char *want = strrchr(S.solution, '/');
    want = want ? want + 1 : S.solution;
    struct stat st;
    return S.solution_stat && strcmp(base, want) == 0 && stat(name, &st) == 0 &&
           st.st_dev == S.solution_dev && st.st_ino == S.solution_ino;
}

static enum kind kind_of(struct link_map *map) {
    if (map == S.own)
        return DRIVER;
    if (map == __atomic_load_n(&solution_map, __ATOMIC_ACQUIRE))
        return SOLUTION;
    const char *name = map->l_name ? map->l_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (is_solution(name, base)) {
        __atomic_store_n(&solution_map, map, __ATOMIC_RELEASE);
        return SOLUTION;
    }
    for (const char *const *p = driver; *p; p++)
        if (starts(base, *p))
            return DRIVER;
    if (starts(base, "libcudart.so"))
        return RUNTIME;
    for (const char *const *p = passed; *p; p++)
        if (starts(base, *p))
            return PASS;
    for (const char *const *t = trusted; *t; t++)
        if (fnmatch(*t, base, 0) == 0)
            return TRUSTED;
    return OTHER;
}

__attribute__((noreturn)) static void refuse(int i, const CUpti_CallbackData *cb, const char *how,
                                             struct link_map *where, struct link_map *through) {
    char at[256], via[256], detail[1536];
    base_name(at, sizeof at, where);
    base_name(via, sizeof via, through);
    const char *called = cb && cb->functionName ? cb->functionName : table[i].name;
    if (through)
        snprintf(detail, sizeof detail,
                 "%s called %s (%s, through %s) after the CUDA API guard was armed", called, how,
                 at, via);
    else
        snprintf(detail, sizeof detail, "%s called %s (%s) after the CUDA API guard was armed",
                 called, how, at);
    report(table[i].name, detail);
}

/* A call of forbidden function i: return if it is not the solution's. */
static void judge(int i, const CUpti_CallbackData *cb) {
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    struct link_map *caller = NULL;  /* the first frame of neither CUDA nor the C runtime */
    int outside = 0;                 /* a frame outside the driver and CUPTI was seen */
    for (int k = 0; k < n; k++) {
        if (!frames[k])
            continue;
        /* a return address may be one past the calling function's end: look just before */
        void *pc = k ? (void *)((char *)frames[k] - 1) : frames[k];
        struct link_map *map = object_of(pc);
#ifdef COMMBENCH_CUPTI_TRACE  /* a diagnostic build: every frame judged, on stderr */
        {
            char name[256], line[512];
            base_name(name, sizeof name, map);
            snprintf(line, sizeof line, "commbench guard: %s frame %d %p %s kind %d\n",
                     table[i].name, k, frames[k], name, map ? (int)kind_of(map) : -1);
            put(2, line);
        }
#endif
        if (!map)
            refuse(i, cb, "from code outside every loaded object (written at run time)", NULL,
                   caller);
        enum kind kind = kind_of(map);
        if (kind == DRIVER)
            continue;
        /* a driver function the runtime calls to do a runtime function's work: that runtime
         * function had its own callback, judged there */
        if (kind == RUNTIME && table[i].domain == CUPTI_CB_DOMAIN_DRIVER_API && !outside)
            return;
        outside = 1;
        switch (kind) {
        case DRIVER:
        case RUNTIME:
        case PASS:
            break;
        case SOLUTION:
            refuse(i, cb, "by the solution", map, caller);
        case TRUSTED:
            if (!caller)
                return;  /* the library's own call, on the solution's behalf or not */
            break;
        case OTHER:
            if (window)
                refuse(i, cb, "while the solution's call ran (the harness makes no CUDA call then)",
                       map, caller);
            if (!caller)
                caller = map;
            break;
        }
    }
    if (!caller)
        refuse(i, cb,
               n >= MAX_FRAMES ? "with a stack too deep to judge"
                               : "with no caller but the CUDA libraries and the C runtime (a "
                                 "thread or host function that starts in it)",
               NULL, NULL);
}

static void CUPTIAPI on_call(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void *data) {
    const CUpti_CallbackData *cb = data;
    (void)userdata;
    if (!cb || cb->callbackSite != CUPTI_API_ENTER)
        return;
    if (checking && domain == CANARY_DOMAIN && cbid == CANARY_CBID) {
        canary_seen = 1;
        return;
    }
    int i = lookup(domain, cbid);
    if (i >= 0)
        judge(i, cb);
}

/* -- what the device did: copies and memsets by any route ----------------------------------
 * Where the task forbids the copy (memset) functions, it forbids what they do: CUPTI's
 * activity records tell of every copy (memset) the device made, however it was asked for (a
 * CUDA graph's memcpy node, a batch copy, a prefetch, a peer copy). Every one that ran,
 * even in part, while a call window was open (the harness makes none then: its uploads end
 * before the window opens, its fetch begins after the window closed) is the solution's. The
 * windows' times are kept (CUPTI's clock, the one its records use); the records are judged as
 * CUPTI hands them over, and all of them at the check after the last call. */
#if COMMBENCH_FORBID_COPIES || COMMBENCH_FORBID_SETS
#define RECORDS_BUFFER (1u << 20)

struct span {
    uint64_t from, to; /* to == 0: still open */
};
static struct span *spans;
static size_t nspans, capspans;
static pthread_mutex_t spans_lock = PTHREAD_MUTEX_INITIALIZER;

static void window_times(int open) {
    uint64_t now = 0;
    if (cuptiGetTimestamp(&now) != CUPTI_SUCCESS)
        return;
    pthread_mutex_lock(&spans_lock);
    if (open) {
        if (nspans == capspans) {
            size_t cap = capspans ? 2 * capspans : 1024;
            struct span *grown = realloc(spans, cap * sizeof *spans);
            if (grown) {
                spans = grown;
                capspans = cap;
            }
        }
        if (nspans < capspans)
            spans[nspans++] = (struct span){now, 0};
    } else if (nspans && spans[nspans - 1].to == 0) {
        spans[nspans - 1].to = now;
    }
    pthread_mutex_unlock(&spans_lock);
}

/* Whether [start, end] meets a call window: the last window opened before `end`. */
static int in_window(uint64_t start, uint64_t end) {
    int hit = 0;
    pthread_mutex_lock(&spans_lock);
    size_t lo = 0, hi = nspans;
    while (lo < hi) { /* the first window opened after `end` */
        size_t mid = (lo + hi) / 2;
        if (spans[mid].from <= end)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0) {
        const struct span *w = &spans[lo - 1];
        hit = w->to == 0 || w->to >= start;
    }
    pthread_mutex_unlock(&spans_lock);
    return hit;
}

static void CUPTIAPI records_wanted(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, RECORDS_BUFFER);
    *size = *buffer ? RECORDS_BUFFER : 0;
    *max_records = 0;
}

static void device_did(const char *capability, const char *what, uint64_t start, uint64_t end, uint64_t bytes,
                       uint32_t correlation) {
    if (!in_window(start, end))
        return;
    char detail[512];
    snprintf(detail, sizeof detail,
             "the device made %s of %llu bytes while the solution's call ran (CUDA correlation "
             "id %u): the task forbids it by any route (a copy function, a CUDA graph's node, "
             "a batch or peer copy)",
             what, (unsigned long long)bytes, correlation);
    report(capability, detail);
}

static void CUPTIAPI records_done(CUcontext context, uint32_t stream, uint8_t *buffer,
                                  size_t size, size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (valid && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const void *)record;
            device_did("copy-engine", "a copy", m->start, m->end, m->bytes, m->correlationId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY2: {
            const CUpti_ActivityMemcpyPtoP4 *m = (const void *)record;
            device_did("copy-engine", "a peer copy", m->start, m->end, m->bytes, m->correlationId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const void *)record;
            device_did("memset", "a memset", m->start, m->end, m->bytes, m->correlationId);
            break;
        }
        default:
            break;
        }
    }
    free(buffer);
}

static int watch_device(void) {
    CUptiResult r = cuptiActivityRegisterCallbacks(records_wanted, records_done);
    if (r != CUPTI_SUCCESS) {
        cupti_error("cuptiActivityRegisterCallbacks", r);
        return 4;
    }
    static const CUpti_ActivityKind kinds[] = {
#if COMMBENCH_FORBID_COPIES
        CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY2,
#endif
#if COMMBENCH_FORBID_SETS
        CUPTI_ACTIVITY_KIND_MEMSET,
#endif
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        r = cuptiActivityEnable(kinds[k]);
        if (r != CUPTI_SUCCESS) {
            cupti_error("cuptiActivityEnable", r);
            return 5;
        }
    }
    return 0;
}

static void judge_records(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}
#else
static void window_times(int open) { (void)open; }
static int watch_device(void) { return 0; }
static void judge_records(void) {}
#endif

/* -- arming --------------------------------------------------------------------------------- */

/* The report path, "%r" replaced by the rank (as the interposer does). */
static void set_report(void) {
    commbench_report_path(S.report, sizeof S.report);
}

static void cupti_error(const char *what, CUptiResult r) {
    const char *text = NULL;
    char line[512];
    if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || !text)
        text = "unknown error";
    snprintf(line, sizeof line, "commbench guard: CUDA API guard not armed: %s: %s (%d)\n", what,
             text, (int)r);
    put(2, line);
}

/* Arm the guard for the solution at `solution_path` (the path the harness will load it from;
 * it need not be loaded yet). Returns 0 when armed (again: arming is one-way, a later call
 * changes nothing), nonzero when the guard could not be armed (a message on stderr): the
 * solution must not run unguarded then. */
EXPORT int commbench_guard_cupti_arm(const char *solution_path) {
    int result = 0;
    while (__atomic_test_and_set(&arming, __ATOMIC_ACQUIRE))
        ;
    if (S.armed)
        goto out;
    if (!solution_path || !solution_path[0] || strlen(solution_path) >= sizeof S.solution) {
        put(2, "commbench guard: CUDA API guard not armed: no solution path\n");
        result = 1;
        goto out;
    }
    snprintf(S.solution, sizeof S.solution, "%s", solution_path);
    struct stat st;
    if (stat(solution_path, &st) == 0) {
        S.solution_stat = 1;
        S.solution_dev = st.st_dev;
        S.solution_ino = st.st_ino;
    }
    set_report();
    Dl_info info;
    if (!dladdr1((void *)commbench_guard_cupti_arm, &info, (void **)&S.own, RTLD_DL_LINKMAP))
        S.own = NULL;
    S.find_object = (find_object_fn)dlsym(RTLD_DEFAULT, "_dl_find_object");
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (cuda)  /* kept open: the canary is called through it */
        S.canary = (driver_version_fn)dlsym(cuda, "cuDriverGetVersion");
    void *warm[4];
    backtrace(warm, 4);  /* loads libgcc_s's unwinder now, not inside a callback */

    CUptiResult r = cuptiSubscribe(&S.subscriber, on_call, NULL);
    if (r != CUPTI_SUCCESS) {
        cupti_error("cuptiSubscribe", r);
        result = 2;
        goto out;
    }
    for (int i = 0; i < COMMBENCH_NCBID; i++) {
        r = cuptiEnableCallback(1, S.subscriber, table[i].domain, table[i].cbid);
        if (r != CUPTI_SUCCESS) {
            cupti_error(table[i].name, r);
            result = 3;
            goto out;
        }
    }
    if (S.canary && lookup(CANARY_DOMAIN, CANARY_CBID) < 0) {
        r = cuptiEnableCallback(1, S.subscriber, CANARY_DOMAIN, CANARY_CBID);
        if (r != CUPTI_SUCCESS)
            S.canary = NULL;  /* the check then relies on the callback states alone */
    }
    result = watch_device();
    if (result != 0)
        goto out;
    S.armed = 1;
    mprotect(&guard_state, STATE_BYTES, PROT_READ);
out:
    __atomic_clear(&arming, __ATOMIC_RELEASE);
    return result;
}

/* Open (1) or close (0) the call window (see `window`); the harness's own, around each call
 * of the solution. Exported under a name every native answer is forbidden to use. */
EXPORT void commbench_guard_cupti_window(int open) {
    if (open)
        window_times(1);
    __atomic_store_n(&window, open ? 1 : 0, __ATOMIC_RELEASE);
    if (!open)
        window_times(0);
}

EXPORT int commbench_guard_cupti_armed(void) {
    return S.armed;
}

/* 0 when the guard still watches every forbidden function, -1 when it was never armed; a
 * guard switched off is reported as a forbidden call and ends the process. */
EXPORT int commbench_guard_cupti_check(void) {
    if (!S.armed)
        return -1;
    judge_records(); /* every copy and memset the device made so far (reported: no return) */
    char why[512] = "";
    for (int i = 0; i < COMMBENCH_NCBID && !why[0]; i++) {
        uint32_t on = 0;
        CUptiResult r = cuptiGetCallbackState(&on, S.subscriber, table[i].domain, table[i].cbid);
        if (r != CUPTI_SUCCESS || !on)
            snprintf(why, sizeof why, "its callback for %s is %s", table[i].name,
                     r != CUPTI_SUCCESS ? "gone (CUPTI detached or unsubscribed)" : "disabled");
    }
    if (!why[0] && S.canary) {
        int version = 0;
        canary_seen = 0;
        checking = 1;
        S.canary(&version);
        checking = 0;
        if (!canary_seen)
            snprintf(why, sizeof why, "its callback no longer runs (cuDriverGetVersion unseen)");
    }
    if (why[0]) {
        char detail[1024];
        snprintf(detail, sizeof detail,
                 "the CUDA API guard was switched off while the solution ran: %s", why);
        report("cupti", detail);
    }
    return 0;
}

/* How many API functions this build watches (for the tests and a log line). */
EXPORT int commbench_guard_cupti_functions(void) {
    return COMMBENCH_NCBID;
}
