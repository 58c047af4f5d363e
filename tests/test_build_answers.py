"""cmake/PyggmlAnswers.cmake: configure-time check answers kept across scikit-build-core's
clearing of CMake's cache, restored only under the key they were saved with."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CMAKE = shutil.which("cmake")
pytestmark = [pytest.mark.tooling, pytest.mark.skipif(CMAKE is None, reason="needs cmake on PATH")]


def run_script(tmp_path, body):
    script = tmp_path / "s.cmake"
    script.write_text(f'include("{ROOT / "cmake" / "PyggmlAnswers.cmake"}")\n{body}\n')
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_answers_come_back_under_their_key_only(tmp_path):
    f = tmp_path / "answers.txt"
    run_script(tmp_path, f'''
set(HAVE_A 1 CACHE INTERNAL "")
set(HAVE_B "" CACHE INTERNAL "")
set(FLAGS_C "-fopenmp;-x" CACHE STRING "doc")
pyggml_answers_save("{f}" "k1" HAVE_A HAVE_B FLAGS_C NOT_DEFINED_D)''')
    text = f.read_text()
    assert "set(_pyggml_saved_key [==[k1]==])" in text
    assert "set(HAVE_A [==[1]==] CACHE INTERNAL" in text and "set(FLAGS_C [==[-fopenmp;-x]==] CACHE STRING" in text
    assert "NOT_DEFINED_D" not in text                    # an answer never found is not kept
    out = run_script(tmp_path, f'''
pyggml_answers_restore("{f}" "k1")
foreach(v HAVE_A HAVE_B FLAGS_C)
  if(DEFINED CACHE{{${{v}}}})
    message("${{v}}=[${{${{v}}}}]")
  endif()
endforeach()''')
    assert "HAVE_A=[1]" in out and "HAVE_B=[]" in out and "FLAGS_C=[-fopenmp;-x]" in out
    assert "reused from" in out
    out = run_script(tmp_path, f'''
pyggml_answers_restore("{f}" "k2")
if(DEFINED HAVE_A)
  message("HAVE_A leaked")
endif()''')
    assert "HAVE_A leaked" not in out and "another toolchain or headers" in out


def test_save_rewrites_only_a_changed_file(tmp_path):
    f = tmp_path / "answers.txt"
    body = f'set(HAVE_A 1 CACHE INTERNAL "")\npyggml_answers_save("{f}" "k" HAVE_A)'
    run_script(tmp_path, body)
    first = f.stat().st_mtime_ns
    run_script(tmp_path, body)
    assert f.stat().st_mtime_ns == first
    run_script(tmp_path, body.replace("HAVE_A 1", "HAVE_A 0"))
    assert "set(HAVE_A [==[0]==]" in f.read_text()


def test_a_missing_file_restores_nothing(tmp_path):
    out = run_script(tmp_path, f'pyggml_answers_restore("{tmp_path / "none.txt"}" "k")\n'
                               'if(DEFINED HAVE_A)\n  message("leaked")\nendif()')
    assert "leaked" not in out and "reused" not in out
