/* The run-time half of a task's `forbid` list for native calls: an LD_PRELOAD library that
 * exports, under the same names, every function of MPI / NCCL / NVSHMEM that a forbidden
 * pattern's family covers, and ends the process when one is called after the harness armed it.
 *
 * Generated per task by pytest_commbench/interposer.py, which writes `commbench_stubs.h`:
 *
 *   #define COMMBENCH_SYMBOLS(X) X(0, MPI_Allreduce, 0) X(1, PMPI_Allreduce, 0) ...
 *                                    index, name, library index
 *   #define COMMBENCH_NSYM 2
 *   #define COMMBENCH_LIBRARIES "/path/libmpi.so.40",          the libraries, by index
 *   #define COMMBENCH_TRUSTED_DIRS "/path/lib/", ...           their own objects' folders
 *   #define COMMBENCH_TRUSTED_TREES "/path/lib/openmpi/", ...  (one level / any depth)
 *
 * How a call goes. Each exported name is a two-instruction trampoline, `jmp *slot(%rip)`, so
 * forwarding needs no knowledge of the function's signature. A slot starts at the symbol's
 * lazy stub, which saves the argument registers, asks commbench_resolve() where to go and
 * jumps there with the registers restored: before arming that is the real function (found
 * with dlsym(RTLD_NEXT), or in the library by path when the library was dlopen'ed with
 * RTLD_LOCAL, as mpi4py does) and the slot keeps it, so later calls cost one indirect jump.
 *
 * commbench_guard_arm() (exported; one-way, nothing disarms) points every slot back at its
 * lazy stub and makes the page holding the slots, the armed flag and the report path
 * read-only. From then on every call of a covered name reaches commbench_resolve(), which
 * forwards calls made from inside the library's own installation (Open MPI's own code calls
 * PMPI_Allreduce, ROMIO calls MPI_Bcast, ...), and for any other caller writes
 * {"forbidden": "<name>", "detail": ...} to $COMMBENCH_GUARD_REPORT (as it was when armed,
 * "%r" replaced by the rank) and ends the process with _exit(86).
 *
 * x86-64 only (the trampolines are assembly); interposer.py builds nothing elsewhere.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "commbench_stubs.h"
#include "guard_report.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define GUARD_EXIT 86    /* a forbidden call (the same code as the Python audit hook's) */
#define RESOLVE_EXIT 87  /* the real function cannot be found: the preload does not fit */

/* -- the trampolines ------------------------------------------------------------------- */

#define STR_(x) #x
#define STR(x) STR_(x)

/* NAME: jmp through its slot. commbench_lazy_I: tell the common path which symbol it is. */
#define TRAMPOLINE(i, name, lib)                                                   \
    __asm__(".text\n"                                                              \
            ".globl " STR(name) "\n"                                               \
            ".type " STR(name) ", @function\n"                                     \
            ".p2align 4\n" STR(name) ":\n"                                         \
            "\tjmp *commbench_state+" STR(i) "*8(%rip)\n"                          \
            ".size " STR(name) ", .-" STR(name) "\n"                               \
            ".p2align 4\ncommbench_lazy_" STR(i) ":\n"                             \
            "\tmovl $" STR(i) ", %r11d\n"                                          \
            "\tjmp commbench_common\n");
COMMBENCH_SYMBOLS(TRAMPOLINE)

/* Entered by a jmp from NAME, so 0(%rsp) is the caller's return address and the stack is
 * 8 mod 16. Saves everything a call may pass arguments in (rdi..r9, rax for varargs, r10,
 * xmm0-7), calls commbench_resolve(index, return address), restores and jumps to the
 * address it returned. */
__asm__(".text\n"
        ".p2align 4\n"
        "commbench_common:\n"
        "\tpushq %rbp\n"
        "\tmovq %rsp, %rbp\n"
        "\tpushq %rdi\n\tpushq %rsi\n\tpushq %rdx\n\tpushq %rcx\n"
        "\tpushq %r8\n\tpushq %r9\n\tpushq %rax\n\tpushq %r10\n"
        "\tsubq $128, %rsp\n"
        "\tmovdqu %xmm0, 0(%rsp)\n\tmovdqu %xmm1, 16(%rsp)\n"
        "\tmovdqu %xmm2, 32(%rsp)\n\tmovdqu %xmm3, 48(%rsp)\n"
        "\tmovdqu %xmm4, 64(%rsp)\n\tmovdqu %xmm5, 80(%rsp)\n"
        "\tmovdqu %xmm6, 96(%rsp)\n\tmovdqu %xmm7, 112(%rsp)\n"
        "\tmovl %r11d, %edi\n"
        "\tmovq 8(%rbp), %rsi\n"
        "\tcall commbench_resolve\n"
        "\tmovq %rax, %r11\n"
        "\tmovdqu 0(%rsp), %xmm0\n\tmovdqu 16(%rsp), %xmm1\n"
        "\tmovdqu 32(%rsp), %xmm2\n\tmovdqu 48(%rsp), %xmm3\n"
        "\tmovdqu 64(%rsp), %xmm4\n\tmovdqu 80(%rsp), %xmm5\n"
        "\tmovdqu 96(%rsp), %xmm6\n\tmovdqu 112(%rsp), %xmm7\n"
        "\taddq $128, %rsp\n"
        "\tpopq %r10\n\tpopq %rax\n\tpopq %r9\n\tpopq %r8\n"
        "\tpopq %rcx\n\tpopq %rdx\n\tpopq %rsi\n\tpopq %rdi\n"
        "\tpopq %rbp\n"
        "\tjmp *%r11\n");

/* -- state: the slots first (the trampolines address them from the start), one page or more,
 *    read-only once armed ------------------------------------------------------------- */

#define DECLARE_LAZY(i, name, lib) extern char commbench_lazy_##i[] HIDDEN;
COMMBENCH_SYMBOLS(DECLARE_LAZY)
#define LAZY_ADDRESS(i, name, lib) [i] = commbench_lazy_##i,
#define NAME_OF(i, name, lib) [i] = STR(name),
#define LIBRARY_OF(i, name, lib) [i] = lib,

struct state {
    void *slot[COMMBENCH_NSYM + 1];
    int armed;
    char report[PATH_MAX];
};
#define STATE_BYTES ((sizeof(struct state) + 4095) & ~(size_t)4095)

HIDDEN union {
    struct state s;
    char page[STATE_BYTES];
} commbench_state __attribute__((aligned(4096))) = {.s = {.slot = {COMMBENCH_SYMBOLS(LAZY_ADDRESS)}}};
#define S commbench_state.s

static char *const lazy[COMMBENCH_NSYM + 1] = {COMMBENCH_SYMBOLS(LAZY_ADDRESS)};
static const char *const names[COMMBENCH_NSYM + 1] = {COMMBENCH_SYMBOLS(NAME_OF)};
static const int library_of[COMMBENCH_NSYM + 1] = {COMMBENCH_SYMBOLS(LIBRARY_OF)};
static const char *const libraries[] = {COMMBENCH_LIBRARIES NULL};
static const char *const trusted_dirs[] = {COMMBENCH_TRUSTED_DIRS NULL};
static const char *const trusted_trees[] = {COMMBENCH_TRUSTED_TREES NULL};
static void *real[COMMBENCH_NSYM + 1];  /* the real functions, as found */
static char arming;  /* a spin lock: a slot is never set to a real function once armed */

static void lock(void) {
    while (__atomic_test_and_set(&arming, __ATOMIC_ACQUIRE))
        ;
}

static void unlock(void) {
    __atomic_clear(&arming, __ATOMIC_RELEASE);
}

static void put(int fd, const char *text);

/* -- dlsym --------------------------------------------------------------------------------
 * A lookup of a covered name, with any handle (dlopen("libmpi.so") then dlsym would reach the
 * real function), gets the trampoline, which checks the call when it is made. Other lookups go
 * on to the real dlsym by a tail jump, so that it still sees its caller's return address
 * (RTLD_NEXT depends on it). dlvsym is not covered: the real dlsym is found with it. */

#define DECLARE_STUB(i, name, lib) extern char name[];
COMMBENCH_SYMBOLS(DECLARE_STUB)
#define STUB_ADDRESS(i, name, lib) [i] = name,
static char *const stubs[COMMBENCH_NSYM + 1] = {COMMBENCH_SYMBOLS(STUB_ADDRESS)};

HIDDEN void *commbench_real_dlsym;

static void find_dlsym(void) {
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", NULL};
    for (const char *const *v = versions; *v && !commbench_real_dlsym; v++)
        commbench_real_dlsym = dlvsym(RTLD_NEXT, "dlsym", *v);
    if (!commbench_real_dlsym) {
        put(2, "commbench guard: cannot find the real dlsym\n");
        _exit(RESOLVE_EXIT);
    }
}

static void *real_dlsym(void *handle, const char *name) {
    if (!commbench_real_dlsym)
        find_dlsym();
    return ((void *(*)(void *, const char *))commbench_real_dlsym)(handle, name);
}

/* The trampoline of a covered name, or NULL: look it up for real. */
HIDDEN __attribute__((used)) void *commbench_dlsym_filter(void *handle, const char *name) {
    (void)handle;
    if (!commbench_real_dlsym)
        find_dlsym();
    int lo = 0, hi = COMMBENCH_NSYM - 1;  /* the names are sorted */
    while (name && lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, names[mid]);
        if (c == 0)
            return stubs[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

__asm__(".text\n.globl dlsym\n.type dlsym, @function\n.p2align 4\ndlsym:\n"
        "\tpushq %rdi\n\tpushq %rsi\n\tsubq $8, %rsp\n"
        "\tcall commbench_dlsym_filter\n"
        "\taddq $8, %rsp\n\tpopq %rsi\n\tpopq %rdi\n"
        "\ttestq %rax, %rax\n\tjz 1f\n\tret\n"
        "1:\tjmp *commbench_real_dlsym(%rip)\n.size dlsym, .-dlsym\n");

/* -- finding the real function ------------------------------------------------------------ */

static int is_ours(const void *p) {
    Dl_info mine, theirs;
    return dladdr((void *)is_ours, &mine) && dladdr(p, &theirs) && mine.dli_fbase == theirs.dli_fbase;
}

struct search { const char *name; void *found; };

static int search_object(struct dl_phdr_info *info, size_t size, void *data) {
    struct search *q = data;
    (void)size;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *p = real_dlsym(h, q->name);
    dlclose(h);
    if (p && !is_ours(p)) {
        q->found = p;
        return 1;
    }
    return 0;
}

static void *find_real(unsigned i) {
    void *p = real[i];
    if (p)
        return p;
    p = real_dlsym(RTLD_NEXT, names[i]);
    if (!p || is_ours(p)) {  /* not in the global scope: loaded RTLD_LOCAL (mpi4py does) */
        p = NULL;
        void *h = dlopen(libraries[library_of[i]], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            p = real_dlsym(h, names[i]);
            dlclose(h);
            if (p && is_ours(p))
                p = NULL;
        }
    }
    if (!p) {  /* the same library under another path (a sandbox's bind mount) */
        struct search q = {names[i], NULL};
        dl_iterate_phdr(search_object, &q);
        p = q.found;
    }
    if (p)
        __atomic_store_n(&real[i], p, __ATOMIC_RELEASE);
    return p;
}

/* -- after arming -------------------------------------------------------------------------- */

static int in_folder(const char *path, const char *dir, int any_depth) {
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) != 0)
        return 0;
    return any_depth || strchr(path + n, '/') == NULL;
}

/* A call made from inside the library's own installation (its folder, or an `openmpi*`
 * component folder under it): the library using itself, not the solution. */
static int trusted_caller(void *ret) {
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr(ret, &info) || !info.dli_fname || !info.dli_fname[0] || is_ours(ret))
        return 0;
    if (!realpath(info.dli_fname, path))
        return 0;
    for (const char *const *d = trusted_dirs; *d; d++)
        if (in_folder(path, *d, 0))
            return 1;
    for (const char *const *d = trusted_trees; *d; d++)
        if (in_folder(path, *d, 1))
            return 1;
    return 0;
}

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

/* Only what a JSON string may hold as is (a path is quoted with the rest replaced by '?'). */
static void json_safe(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == '"' || *s == '\\' || (unsigned char)*s >= 0x7f)
            *s = '?';
}

__attribute__((noreturn)) static void refuse(unsigned i, void *ret) {
    char caller[256] = "unknown code", line[1024];
    Dl_info info;
    if (dladdr(ret, &info) && info.dli_fname && info.dli_fname[0]) {
        const char *base = strrchr(info.dli_fname, '/');
        snprintf(caller, sizeof caller, "%s", base ? base + 1 : info.dli_fname);
    }
    json_safe(caller);
    snprintf(line, sizeof line,
             "{\"forbidden\": \"%s\", \"detail\": \"%s called from %s while the solution ran\"}\n",
             names[i], names[i], caller);
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

/* Called by commbench_common with the symbol's index and the caller's return address. */
HIDDEN __attribute__((used)) void *commbench_resolve(unsigned i, void *ret) {
    void *p = find_real(i);
    if (!__atomic_load_n(&S.armed, __ATOMIC_ACQUIRE)) {
        lock();
        if (p && !S.armed)  /* from now on calls jump straight to p */
            __atomic_store_n(&S.slot[i], p, __ATOMIC_RELEASE);
        unlock();
    }
    if (__atomic_load_n(&S.armed, __ATOMIC_ACQUIRE) && !trusted_caller(ret))
        refuse(i, ret);
    if (p)
        return p;
    put(2, "commbench guard: cannot find the real ");
    put(2, names[i]);
    put(2, " (the preloaded interposer was built for another library)\n");
    _exit(RESOLVE_EXIT);
}

/* The report path, "%r" replaced by the rank. */
static void set_report(void) {
    commbench_report_path(S.report, sizeof S.report);
}

EXPORT void commbench_guard_arm(void) {
    for (unsigned i = 0; i < COMMBENCH_NSYM; i++)
        find_real(i);  /* while the libraries are surely loaded; a miss is found later */
    lock();
    if (!S.armed) {
        set_report();
        __atomic_store_n(&S.armed, 1, __ATOMIC_RELEASE);
        for (unsigned i = 0; i < COMMBENCH_NSYM; i++)
            __atomic_store_n(&S.slot[i], (void *)lazy[i], __ATOMIC_RELEASE);
        mprotect(&commbench_state, STATE_BYTES, PROT_READ);
    }
    unlock();
}

EXPORT int commbench_guard_armed(void) {
    return __atomic_load_n(&S.armed, __ATOMIC_ACQUIRE);
}

/* How many names this build covers (for the tests and a log line). */
EXPORT int commbench_guard_symbols(void) {
    return COMMBENCH_NSYM;
}
