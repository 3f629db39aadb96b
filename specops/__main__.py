"""``python -m specops``: the package's main job (a verification step, until the engine lands)."""

from specops.demo import main

main()
