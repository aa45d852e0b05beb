/* data.c — memory-mapped token files (lp_data.h). */
#define _POSIX_C_SOURCE 200809L
#include "lp_data.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)

struct lp_data {
  char *path;
  const unsigned char *map; /* the whole file (NULL for an empty map) */
  size_t map_len;
  lp_data_info info;
  lp_data_opts opts;
  int perm_half_bits; /* Feistel half width: the domain is 4^half >= windows */
};

static uint32_t rd32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t token_at(const lp_data *d, int64_t i) {
  const unsigned char *p = d->map + d->info.data_offset + i * d->info.token_bytes;
  return d->info.token_bytes == 2 ? (uint32_t)(p[0] | p[1] << 8) : rd32(p);
}

/* Reads the shard header at the start of a mapped file of `size` bytes:
 * fills info or explains what disagrees. */
static lp_status read_shard_header(const char *path, const unsigned char *m,
                                   size_t size, lp_data_info *info, char *err) {
  if (size < LLMC_HEADER_BYTES) {
    lp_errf(err, "%s: an llm.c shard header is %d bytes, the file has %zu bytes", path,
            LLMC_HEADER_BYTES, size);
    return LP_ERR_PARSE;
  }
  uint32_t version = rd32(m + 4), count = rd32(m + 8);
  if (version != 1 && version != 2) {
    lp_errf(err, "%s: llm.c shard version %u at byte offset 4 (1 = uint16 tokens, "
            "2 = uint32 tokens)", path, version);
    return LP_ERR_PARSE;
  }
  info->format = "llm.c";
  info->token_bytes = version == 1 ? 2 : 4;
  info->data_offset = LLMC_HEADER_BYTES;
  uint64_t want = LLMC_HEADER_BYTES + (uint64_t)count * (uint64_t)info->token_bytes;
  if (want != size) {
    lp_errf(err, "%s: the llm.c header at byte offset 8 says %u tokens (%llu bytes with "
            "the header), the file has %zu bytes", path, count, (unsigned long long)want, size);
    return LP_ERR_PARSE;
  }
  info->tokens = count;
  return LP_OK;
}

static void setup_perm(lp_data *d) {
  int bits = 0;
  while (bits < 62 && ((int64_t)1 << bits) < d->info.windows) bits++;
  d->perm_half_bits = bits < 2 ? 1 : (bits + 1) / 2;
}

lp_status lp_data_open(const char *path, const lp_data_opts *opts, lp_data **out, char *err) {
  *out = NULL;
  if (!path || !opts) {
    lp_errf(err, "data: a path and options are needed");
    return LP_ERR_ARG;
  }
  if (opts->seq_len <= 0) {
    lp_errf(err, "%s: sequence length %d must be positive", path, opts->seq_len);
    return LP_ERR_ARG;
  }
  if (opts->token_bytes != 0 && opts->token_bytes != 2 && opts->token_bytes != 4) {
    lp_errf(err, "%s: token size %d bytes: it takes 2 (uint16) or 4 (uint32)", path,
            opts->token_bytes);
    return LP_ERR_ARG;
  }
  if (opts->vocab < 0) {
    lp_errf(err, "%s: vocabulary size %lld must be positive (0: not checked)", path,
            (long long)opts->vocab);
    return LP_ERR_ARG;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    lp_errf(err, "cannot open %s: %s", path, strerror(errno));
    return LP_ERR_IO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    lp_errf(err, "%s is not a regular file", path);
    close(fd);
    return LP_ERR_IO;
  }
  size_t size = (size_t)st.st_size;
  const unsigned char *map = NULL;
  if (size > 0) {
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      lp_errf(err, "cannot map %s: %s", path, strerror(errno));
      close(fd);
      return LP_ERR_IO;
    }
    map = m;
  }
  close(fd);

  lp_status rc = LP_OK;
  lp_data_info info = {0};
  if (size >= 4 && rd32(map) == LLMC_MAGIC) {
    rc = read_shard_header(path, map, size, &info, err);
  } else {
    info.format = "raw";
    info.token_bytes = opts->token_bytes ? opts->token_bytes : 2;
    info.data_offset = 0;
    if (size % (size_t)info.token_bytes != 0) {
      lp_errf(err, "%s: %zu bytes is not a whole number of %d-byte tokens", path, size,
              info.token_bytes);
      rc = LP_ERR_PARSE;
    }
    info.tokens = (int64_t)(size / (size_t)info.token_bytes);
  }
  if (rc == LP_OK && info.tokens < (int64_t)opts->seq_len + 1) {
    lp_errf(err, "%s: %lld tokens, too short for one sequence of %d (it takes %d tokens: "
            "the inputs and the next token)", path, (long long)info.tokens, opts->seq_len,
            opts->seq_len + 1);
    rc = LP_ERR_INVALID;
  }
  lp_data *d = NULL;
  if (rc == LP_OK) {
    d = lp_calloc(1, sizeof *d);
    if (d) d->path = lp_strdup(path);
    if (!d || !d->path) {
      lp_free(d);
      d = NULL;
      lp_errf(err, "%s: out of memory", path);
      rc = LP_ERR_NOMEM;
    }
  }
  if (rc != LP_OK) {
    if (map) munmap((void *)map, size);
    return rc;
  }
  if (opts->check && opts->vocab > 0) {
    lp_data probe = {.map = map, .info = info};
    for (int64_t i = 0; i < info.tokens; i++) {
      uint32_t id = token_at(&probe, i);
      if ((int64_t)id >= opts->vocab) {
        lp_errf(err, "%s: token %u at byte offset %lld is not below the vocabulary size %lld",
                path, id, (long long)(info.data_offset + i * info.token_bytes),
                (long long)opts->vocab);
        lp_free(d->path);
        lp_free(d);
        munmap((void *)map, size);
        return LP_ERR_INVALID;
      }
    }
  }
  info.windows = (info.tokens - 1) / opts->seq_len;
  info.seq_len = opts->seq_len;
  d->map = map;
  d->map_len = size;
  d->info = info;
  d->opts = *opts;
  setup_perm(d);
  *out = d;
  return LP_OK;
}

void lp_data_close(lp_data *d) {
  if (!d) return;
  if (d->map) munmap((void *)d->map, d->map_len);
  lp_free(d->path);
  lp_free(d);
}

void lp_data_info_of(const lp_data *d, lp_data_info *info) { *info = d->info; }

/* splitmix64's finaliser: a well-mixed 64-bit hash. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* A bijection of 0..4^h - 1 keyed by (seed, epoch): a 4-round Feistel
 * network on two h-bit halves. */
static uint64_t feistel(uint64_t x, int h, uint64_t key) {
  uint64_t mask = ((uint64_t)1 << h) - 1;
  uint64_t l = x >> h, r = x & mask;
  for (int round = 0; round < 4; round++) {
    uint64_t f = mix64(key ^ mix64(r + 0x9e3779b97f4a7c15ULL * (uint64_t)(round + 1))) & mask;
    uint64_t t = l ^ f;
    l = r;
    r = t;
  }
  return l << h | r;
}

int64_t lp_data_window(const lp_data *d, int64_t g) {
  int64_t S = d->info.windows;
  int64_t epoch = g / S, w = g % S;
  if (!d->opts.shuffle) return w;
  uint64_t key = mix64(d->opts.seed * 0x2545f4914f6cdd1dULL + (uint64_t)epoch + 1);
  /* cycle-walk: apply the bijection of the larger domain until the value
   * falls inside 0..S-1 (a permutation of 0..S-1; under 4 tries on average) */
  uint64_t x = (uint64_t)w;
  do x = feistel(x, d->perm_half_bits, key);
  while (x >= (uint64_t)S);
  return (int64_t)x;
}

lp_status lp_data_sequence(const lp_data *d, int64_t g, float *inputs, float *targets,
                           char *err) {
  if (g < 0) {
    lp_errf(err, "%s: sequence %lld is negative", d->path, (long long)g);
    return LP_ERR_ARG;
  }
  int T = d->opts.seq_len;
  int64_t first = lp_data_window(d, g) * T;
  for (int t = 0; t <= T; t++) {
    uint32_t id = token_at(d, first + t);
    if (d->opts.vocab > 0 && (int64_t)id >= d->opts.vocab) {
      lp_errf(err, "%s: token %u at byte offset %lld is not below the vocabulary size %lld",
              d->path, id, (long long)(d->info.data_offset + (first + t) * d->info.token_bytes),
              (long long)d->opts.vocab);
      return LP_ERR_INVALID;
    }
    if (t < T) inputs[t] = (float)id;
    if (t > 0) targets[t - 1] = (float)id;
  }
  return LP_OK;
}

int64_t lp_data_position(int64_t step, int microbatches, int rows) {
  return (step - 1) * (int64_t)microbatches * rows;
}

lp_status lp_data_batch(const lp_data *d, int64_t step, int mb, int microbatches, int rows,
                        int dp, int dp_rank, float *inputs, float *targets, char *err) {
  if (step < 1 || microbatches < 1 || mb < 0 || mb >= microbatches || rows < 1 || dp < 1 ||
      dp_rank < 0 || dp_rank >= dp) {
    lp_errf(err, "%s: step %lld, micro-batch %d of %d, %d rows, data-parallel rank %d of %d "
            "is out of range", d->path, (long long)step, mb, microbatches, rows, dp_rank, dp);
    return LP_ERR_ARG;
  }
  if (rows % dp != 0) {
    lp_errf(err, "%s: %d rows per micro-batch do not divide over %d data-parallel ranks",
            d->path, rows, dp);
    return LP_ERR_ARG;
  }
  int share = rows / dp, T = d->opts.seq_len;
  int64_t g0 = lp_data_position(step, microbatches, rows) + (int64_t)mb * rows +
               (int64_t)dp_rank * share;
  for (int r = 0; r < share; r++)
    LP_CHECK(lp_data_sequence(d, g0 + r, inputs + (size_t)r * T, targets + (size_t)r * T, err));
  return LP_OK;
}
