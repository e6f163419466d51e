#!/usr/bin/env zsh
# zsh_complete.zsh SCRIPT 'words typed': the matches an interactive zsh offers when Tab
# is pressed after the words, one per line, with SCRIPT (a completion script) loaded.
# Runs a real interactive zsh on a pseudo-terminal (zsh/zpty); compadd is wrapped to
# print what each completer adds. Markers are spelled in two pieces so the terminal's
# echo of these lines never matches them.
zmodload zsh/zpty || exit 3
zpty z "TERM=xterm zsh -f -i"  # zle needs a terminal type it knows
zpty -w z "PROMPT=; RPROMPT=; autoload -Uz compinit; compinit -u -D"
zpty -w z "source ${(q)1}"
zpty -w z "bindkey '^I' complete-word"
zpty -w z "zstyle ':completion:*' list-grouped false"
zpty -w z "zstyle ':completion:*' insert-tab false"
zpty -w z 'compadd() { local -a __m; builtin compadd -O __m "$@"; (( $#__m )) && print -rl -- "<""m>"${^__m}; builtin compadd "$@" }'
zpty -w z 'finish() { print -r -- "<""done>"; exit }'
zpty -w z 'comppostfuncs=(finish)'
zpty -w -n z "$2"$'\t'
local line
while zpty -r z line; do
  [[ $line == *'<done>'* ]] && break
  line=${line%$'\n'}  # zpty -r keeps the line's end: CR LF from the terminal
  [[ $line == *'<m>'* ]] && print -r -- "${${line##*<m>}%$'\r'}"
done
zpty -d z
