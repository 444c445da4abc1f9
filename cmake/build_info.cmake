# Run at every build (cmake -P): writes build_info.h with the current git commit, rewriting it
# only when something changed so that nothing recompiles needlessly.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE LOCKSTEP_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE LOCKSTEP_GIT_DIRTY OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT LOCKSTEP_GIT_COMMIT)
  set(LOCKSTEP_GIT_COMMIT unknown)
elseif(LOCKSTEP_GIT_DIRTY)
  string(APPEND LOCKSTEP_GIT_COMMIT "-dirty")
endif()
configure_file(${SOURCE_DIR}/src/core/build_info.h.in ${OUTPUT} @ONLY)
