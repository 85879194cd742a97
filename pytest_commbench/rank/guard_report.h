/* Shared by the run-time guards (interpose.c, cupti_guard.c): where a guard writes its report,
 * $COMMBENCH_GUARD_REPORT with "%r" replaced by this process's MPI rank. */
#ifndef COMMBENCH_GUARD_REPORT_H
#define COMMBENCH_GUARD_REPORT_H

#include <stddef.h>
#include <stdlib.h>

static void commbench_report_path(char *out, size_t cap) {
    const char *tmpl = getenv("COMMBENCH_GUARD_REPORT");
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank)
        rank = getenv("PMI_RANK");
    if (!rank)
        rank = getenv("PMIX_RANK");
    if (!rank)
        rank = "0";
    size_t o = 0;
    if (!tmpl)
        return;
    for (const char *c = tmpl; *c && o + 1 < cap; c++) {
        if (c[0] == '%' && c[1] == 'r') {
            for (const char *r = rank; *r && o + 1 < cap; r++)
                out[o++] = *r;
            c++;
        } else {
            out[o++] = *c;
        }
    }
    out[o] = '\0';
}

#endif
