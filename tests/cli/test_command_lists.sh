#!/usr/bin/env bash
# test_command_lists.sh LUAPIPE — one list of the program's commands
# everywhere a person meets it: `luapipe --help`, the table of `luapipe
# help`, the REPL's luapipe.help(), the message for a word that is no
# command, and the README's synopsis all name the same commands in the
# same order (luapipe.cli.commands, the one home of the list).
. "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
want=$("$LP" -e 'io.write(require("luapipe.cli").command_list())')
[ -n "$want" ] || bad "luapipe.cli.command_list() is empty"
for c in schedule simulate bubbles eplb search profile help; do
  case ", $want," in *", $c,"*) ;; *) bad "the command list lacks $c: $want" ;; esac
done
same() { # NAME GOT
  if [ "$2" = "$want" ]; then ok "$1 lists the commands"; else bad "$1: '$2', not '$want'"; fi
}
same "luapipe --help" "$("$LP" --help | sed -n 's/^Commands: \(.*\)$/\1/p')"
same "luapipe help" "$("$LP" help | awk '/^Commands:$/ { on = 1; next } on && /^$/ { exit } on { printf "%s%s", sep, $1; sep = ", " }')"
same "luapipe.help() in the REPL" "$("$LP" -e 'luapipe.help()' | sed -n "s/^The luapipe program's commands (\([^)]*\)) have.*/\1/p")"
"$LP" frobnicate 2>"$tmp/err" >/dev/null
same "the message for a word that is no command" "$(sed -n 's/^Commands: \(.*\) (`luapipe help` for more.*/\1/p' "$tmp/err")"
same "the README's synopsis" "$(sed -n 's/^luapipe <command> \[options\] *\(.*\)$/\1/p' "$src/README.md")"
finish
