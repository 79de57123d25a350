"""First file of the worker program (see the package docstring); not imported.

The parent compiles it to ``<code dir>/child.pyc`` and runs ``python -s -P -B <code dir>/child.pyc``; the rest of
this package is compiled next to it as ``<code dir>/_orchestry_sandbox_child/``. ``-P`` keeps the code directory
off ``sys.path``: it is put there only while the package is imported, then taken off again, so that a program's
imports search exactly the interpreter's own path.
"""

import sys

if __name__ == "__main__":
    sys.path.insert(0, __file__.rpartition("/")[0])
    try:
        from _orchestry_sandbox_child.main import main
    finally:
        sys.path_importer_cache.pop(sys.path.pop(0), None)
    main()
