# cmake -P: writes a header holding every configs/*.yaml as {name, text} pairs, so the binary
# can select built-in configs by name without the source tree.
set(body "")
string(REPLACE "|" ";" INPUTS "${INPUTS}")
foreach(input ${INPUTS})
  get_filename_component(name ${input} NAME_WE)
  file(READ ${input} text)
  string(APPEND body "    {\"${name}\", R\"lockstep_yaml(${text})lockstep_yaml\"},\n")
endforeach()
file(WRITE ${OUTPUT}.tmp "#pragma once\n// Generated from configs/*.yaml by cmake/embed_configs.cmake.\n#include <string_view>\n#include <utility>\nnamespace lockstep::embedded {\ninline constexpr std::pair<std::string_view, std::string_view> kConfigs[] = {\n${body}};\n}  // namespace lockstep::embedded\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
