# Answers of configure-time checks (try_compile and friends), kept in the build folder
# across scikit-build-core's clearing of CMake's cache: it deletes CMakeCache.txt for
# every new isolated build environment, that is for every `pip install .`, so each
# reinstall would compile every check again (OpenMP's flags and spec date, libc's
# pthreads, pyggml's API checks of the ggml headers: 7 s of a 23 s no-change reinstall
# on a 2-core Zen 3). A file holds one set of answers under a key; they are restored
# only when the key, which names everything the answers depend on, is the same.

# The file is CMake code: each value a bracket argument, so a list (OpenMP's
# "gomp;pthread") comes back as it was, not cut at its semicolons.

# pyggml_answers_restore(FILE KEY): the answers FILE keeps under KEY, as CMake cache
# entries (a check whose result variable is defined does not run again), if the key is KEY.
function(pyggml_answers_restore file key)
  if(NOT EXISTS "${file}")
    return()
  endif()
  set(_pyggml_saved_key "")
  set(_pyggml_want_key "${key}")
  set(_pyggml_restored FALSE)
  include("${file}")               # sets the entries only if its key is _pyggml_want_key
  if(_pyggml_restored)
    message(STATUS "pyggml: check answers reused from ${file}")
  else()
    message(STATUS "pyggml: ${file} is for another toolchain or headers: the checks run")
  endif()
endfunction()

# pyggml_answers_save(FILE KEY NAMES...): keep the cache entries (or variables) NAMES,
# those that are defined, under KEY; the file is rewritten only when it changes
function(pyggml_answers_save file key)
  set(_text "# check answers saved by cmake/PyggmlAnswers.cmake: do not edit\n")
  string(APPEND _text "set(_pyggml_saved_key [==[${key}]==])\n")
  string(APPEND _text "if(_pyggml_saved_key STREQUAL _pyggml_want_key)\n")
  foreach(_name IN LISTS ARGN)
    if(NOT DEFINED ${_name} OR "${${_name}}" MATCHES "]==]")
      continue()
    endif()
    get_property(_type CACHE ${_name} PROPERTY TYPE)
    if(NOT _type)
      set(_type INTERNAL)
    endif()
    string(APPEND _text "  set(${_name} [==[${${_name}}]==] CACHE ${_type} \"pyggml: a saved check answer\")\n")
  endforeach()
  string(APPEND _text "  set(_pyggml_restored TRUE)\nendif()\n")
  set(_old "")
  if(EXISTS "${file}")
    file(READ "${file}" _old)
  endif()
  if(NOT _old STREQUAL _text)
    file(WRITE "${file}" "${_text}")
  endif()
endfunction()
