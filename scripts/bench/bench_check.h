/* bench_check.h — the benchmarks' CHECK(call): a core call that fails
 * ends the benchmark with the file, line and status (exit 2). */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include "lp_base.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    lp_status st_ = (call);                                                    \
    if (st_ != LP_OK) {                                                        \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, lp_strerror(st_));    \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)
