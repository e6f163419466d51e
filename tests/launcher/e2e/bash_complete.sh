#!/usr/bin/env bash
# bash_complete.sh SCRIPT [--with-bash-completion] 'words typed': what the completion
# function in SCRIPT offers with the cursor at the end of the words, one per line.
# COMP_LINE, COMP_POINT, COMP_WORDS and COMP_CWORD are set as readline sets them:
# COMP_WORDS split at white space and at each '=' and ':' (bash's word breaks, kept
# as words of their own). --with-bash-completion loads the bash-completion package
# first, as a login shell on Debian does.
script=$1
shift
if [[ $1 == --with-bash-completion ]]; then
  source /usr/share/bash-completion/bash_completion || exit 3
  shift
fi
source "$script" || exit 3
COMP_LINE=$1
COMP_POINT=${#1}
COMP_WORDS=()
for w in $COMP_LINE; do
  while [[ $w =~ ^([^=:]*)([=:])(.*)$ ]]; do
    [[ -n ${BASH_REMATCH[1]} ]] && COMP_WORDS+=("${BASH_REMATCH[1]}")
    COMP_WORDS+=("${BASH_REMATCH[2]}")
    w=${BASH_REMATCH[3]}
  done
  [[ -n $w ]] && COMP_WORDS+=("$w")
done
[[ $COMP_LINE == *' ' ]] && COMP_WORDS+=('')
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_ddprun || exit 5
printf '%s\n' "${COMPREPLY[@]}"
