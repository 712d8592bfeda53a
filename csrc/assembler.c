#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "assembler.h"

/* volatile: the compiler must not drop the stores around memcpy as dead */
static __thread sigjmp_buf *volatile guard_jump;   /* set while this thread is in a guarded copy */
static struct sigaction previous_bus;
static volatile sig_atomic_t guard_installed;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)info;
    (void)context;
    if (guard_jump != NULL)
        siglongjmp(*guard_jump, 1);
    /* not ours: behave as if we were never here */
    sigaction(SIGBUS, &previous_bus, NULL);
    raise(sig);
}

int tsm_install_sigbus_guard(void)
{
    if (guard_installed)
        return 0;
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous_bus) != 0)
        return -1;
    guard_installed = 1;
    return 0;
}

int tsm_guarded_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
    sigjmp_buf jump;
    if (n == 0)
        return 0;
    if (sigsetjmp(jump, 1) != 0) {
        guard_jump = NULL;
        return -1;
    }
    guard_jump = &jump;
    memcpy(dst, src, n);
    guard_jump = NULL;
    return 0;
}

int tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (tsm_guarded_copy(dst, srcs[i], sizes[i]) != 0)
            return -1;
        dst += sizes[i];
    }
    return 0;
}

int tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (tsm_guarded_copy(dsts[i], src, sizes[i]) != 0)
            return -1;
        src += sizes[i];
    }
    return 0;
}
