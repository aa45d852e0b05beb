/* lp_data.h — token datasets: flat binary token files, memory-mapped, read
 * as fixed-length training sequences that are the same for a given (step,
 * micro-batch, row) on every rank and in every run.
 *
 * The files users have:
 *   - raw tokens with no header (nanoGPT's train.bin / val.bin): uint16 by
 *     default, uint32 when asked (token_bytes = 4);
 *   - llm.c's shards: a header of 256 little-endian int32 (magic 20240520,
 *     version 1 = uint16 tokens or 2 = uint32 tokens, then the token count),
 *     1024 bytes in all, then the tokens. A file whose first int32 is the
 *     magic is read as a shard; its header must agree with the file's size.
 *
 * A dataset of N tokens holds S = floor((N - 1) / seq_len) windows; window w
 * is tokens [w * seq_len, w * seq_len + seq_len] (seq_len + 1 of them: the
 * inputs and, shifted by one, the targets). Sequence number g of the run
 * (0, 1, 2, ...) reads window perm_e(g mod S) of epoch e = g / S, where
 * perm_e is the identity (shuffle off) or a bijection of 0..S-1 drawn from
 * (seed, e) (shuffle on); so every window is read once per epoch.
 *
 * Step k (from 1) of a run with M micro-batches of R rows reads sequences
 * g = ((k - 1) * M + mb) * R + row: the position in the file follows from
 * the step alone, so a run resumed after step k reads exactly what the run
 * that never stopped read (lp_data_position says where that is).
 *
 * Errors (LP_ERR_IO, LP_ERR_PARSE, LP_ERR_INVALID) name the file and, for
 * a bad token, its byte offset: "train.bin: token 70000 at byte offset
 * 1024 is not below the vocabulary size 50257". No Lua, no MPI. */
#pragma once

#include <stdint.h>

#include "lp_base.h"

typedef struct lp_data lp_data;

typedef struct lp_data_opts {
  int seq_len;         /* tokens per sequence (> 0) */
  int token_bytes;     /* for a file without header: 2 (default when 0) or 4 */
  int64_t vocab;       /* token ids must be below it; 0: not checked */
  int shuffle;         /* nonzero: each epoch reads the windows in a seeded order */
  int check;           /* nonzero (with vocab): every token is checked at open, so
                        * a bad id stops the run before it starts */
  uint64_t seed;
} lp_data_opts;

typedef struct lp_data_info {
  const char *format;  /* "raw" or "llm.c" */
  int token_bytes;     /* 2 or 4 */
  int seq_len;         /* tokens per sequence */
  int64_t tokens;      /* tokens in the file */
  int64_t windows;     /* sequences per epoch */
  int64_t data_offset; /* byte offset of the first token */
} lp_data_info;

/* Opens and maps path. *out is NULL on failure, with one line in err
 * (LP_ERRLEN) naming the file: missing, empty, a size that is not a whole
 * number of tokens, a shard header that disagrees with the file's size or
 * has an unknown version, too short for one sequence of seq_len + 1
 * tokens; with check and vocab, the first token not below vocab and its
 * byte offset (LP_ERR_INVALID). */
lp_status lp_data_open(const char *path, const lp_data_opts *opts,
                       lp_data **out, char *err);
void lp_data_close(lp_data *d);
void lp_data_info_of(const lp_data *d, lp_data_info *info);

/* The window sequence number g reads (see above). */
int64_t lp_data_window(const lp_data *d, int64_t g);

/* Writes the seq_len inputs and seq_len targets of sequence g as floats
 * (luapipe's tensors are float32: ids up to 2^24 are exact). LP_ERR_INVALID
 * when a token read is not below the vocabulary, naming its byte offset. */
lp_status lp_data_sequence(const lp_data *d, int64_t g, float *inputs,
                           float *targets, char *err);

/* Sequences of the micro-batch mb of step k (from 1) for one data-parallel
 * rank: rows [dp_rank * rows / dp, (dp_rank + 1) * rows / dp) of the
 * micro-batch's `rows` (rows must divide by dp). inputs and targets hold
 * (rows / dp) * seq_len floats each. */
lp_status lp_data_batch(const lp_data *d, int64_t step, int mb,
                        int microbatches, int rows, int dp, int dp_rank,
                        float *inputs, float *targets, char *err);

/* Sequences read by the steps before step k: (k - 1) * microbatches * rows;
 * with the windows per epoch, (epoch, window) of the next read. */
int64_t lp_data_position(int64_t step, int microbatches, int rows);
