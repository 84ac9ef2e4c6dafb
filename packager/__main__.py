"""python -m packager"""

from .cli import main

main(prog_name="edgepack")
