/* pty_run.c — runs a command on a pseudo-terminal, as a user at a terminal
 * would (the shell tests' terminal driver; plain C, so no interpreter is
 * needed on the test machine).
 *
 *   pty_run [--timeout S] [--prompt TEXT]... [--send LINE | --type LINE]... -- CMD [ARGS]
 *
 * Each --send LINE is typed (followed by Enter) once the command waits at a
 * prompt: something was written since the last line was typed, the output
 * ends with one of the --prompt texts (terminal escapes after it aside) and
 * nothing more came for 150 ms (at once when no --prompt is given). Counting
 * prompts instead is fooled by readline, which draws the prompt again when
 * it lists completions, and a line typed early lands in the terminal's
 * cooked mode, where a Ctrl-D is not the end of input readline sees.
 * "^C" and "^D" send Ctrl-C and Ctrl-D without Enter.
 * --type LINE is the same with keys written as escapes: "\t" is Tab and
 * "\\" a backslash (so "s:val\t()" asks for completion mid-line).
 * Everything the command writes to the terminal is copied to stdout (CR LF
 * as LF). Exits with the command's exit status, 128 + signal when a signal
 * killed it, or 124 after --timeout seconds (the command is then killed). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ITEMS 64

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Whether the output ends with the prompt text, escape sequences after it
 * (ESC [ params letter, as readline writes for bracketed paste) aside. */
static int ends_with_prompt(const char *out, size_t n, const char *prompt) {
  size_t k = strlen(prompt);
  for (;;) { /* strip one trailing CSI sequence at a time */
    size_t i = n;
    if (i == 0 ||
        !((out[i - 1] >= 'a' && out[i - 1] <= 'z') || (out[i - 1] >= 'A' && out[i - 1] <= 'Z')))
      break;
    i--;
    while (i > 0 &&
           ((out[i - 1] >= '0' && out[i - 1] <= '9') || out[i - 1] == ';' || out[i - 1] == '?'))
      i--;
    if (i >= 2 && out[i - 1] == '[' && out[i - 2] == '\x1b')
      n = i - 2;
    else
      break;
  }
  return k > 0 && n >= k && memcmp(out + n - k, prompt, k) == 0;
}

/* Writes out[0..n) to stdout with every CR LF as LF. */
static void copy_out(const char *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (out[i] == '\r' && i + 1 < n && out[i + 1] == '\n') continue;
    putchar(out[i]);
  }
  fflush(stdout);
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

static int usage(void) {
  fprintf(stderr, "usage: pty_run [--timeout S] [--prompt TEXT]... [--send LINE | --type LINE]... "
                  "-- CMD [ARGS]\n");
  return 2;
}

int main(int argc, char **argv) {
  double timeout = 30;
  const char *prompts[MAX_ITEMS], *sends[MAX_ITEMS];
  int typed[MAX_ITEMS]; /* --type: escapes in the line */
  int np = 0, ns = 0, i = 1;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    }
    if (i + 1 >= argc) return usage();
    if (strcmp(argv[i], "--timeout") == 0) {
      timeout = atof(argv[++i]);
    } else if (strcmp(argv[i], "--prompt") == 0 && np < MAX_ITEMS) {
      prompts[np++] = argv[++i];
    } else if ((strcmp(argv[i], "--send") == 0 || strcmp(argv[i], "--type") == 0) &&
               ns < MAX_ITEMS) {
      typed[ns] = strcmp(argv[i], "--type") == 0;
      sends[ns++] = argv[++i];
    } else {
      return usage();
    }
  }
  if (i >= argc) return usage();

  int fd;
  pid_t pid = forkpty(&fd, NULL, NULL, NULL);
  if (pid < 0) {
    perror("pty_run: forkpty");
    return 1;
  }
  if (pid == 0) {
    execvp(argv[i], argv + i);
    fprintf(stderr, "pty_run: cannot run %s: %s\n", argv[i], strerror(errno));
    _exit(127);
  }

  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  if (!out) return 1;
  int next = 0;            /* the next --send to type */
  size_t typed_at = 0;     /* len of the output when the last line was typed */
  double last_out = now(); /* when the command last wrote */
  double deadline = now() + timeout;
  for (;;) {
    if (next < ns) {
      int waiting = np == 0;
      if (!waiting && len > typed_at && now() - last_out >= 0.15)
        for (int k = 0; k < np && !waiting; k++)
          waiting = ends_with_prompt(out, len, prompts[k]);
      if (waiting) {
        int esc = typed[next];
        const char *line = sends[next++];
        typed_at = len;
        if (strcmp(line, "^C") == 0) {
          write_all(fd, "\x03", 1);
        } else if (strcmp(line, "^D") == 0) {
          write_all(fd, "\x04", 1);
        } else if (esc) {
          for (const char *c = line; *c; c++) {
            if (c[0] == '\\' && c[1] == 't') {
              write_all(fd, "\t", 1);
              c++;
            } else if (c[0] == '\\' && c[1] == '\\') {
              write_all(fd, "\\", 1);
              c++;
            } else {
              write_all(fd, c, 1);
            }
          }
          write_all(fd, "\r", 1);
        } else {
          write_all(fd, line, strlen(line));
          write_all(fd, "\r", 1);
        }
      }
    }
    double left = deadline - now();
    if (left <= 0) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      copy_out(out, len);
      printf("\n[pty_run: timed out after %gs]\n", timeout);
      return 124;
    }
    struct pollfd p = {fd, POLLIN, 0};
    int ms = left < 0.05 ? (int)(left * 1000) + 1 : 50;
    int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) {
      if (len + 4096 > cap) {
        char *bigger = realloc(out, cap * 2);
        if (!bigger) break;
        out = bigger;
        cap *= 2;
      }
      ssize_t n = read(fd, out + len, 4096);
      if (n <= 0) break; /* EIO: the command closed the terminal */
      len += (size_t)n;
      last_out = now();
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  copy_out(out, len);
  free(out);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}
