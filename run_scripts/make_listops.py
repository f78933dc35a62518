#!/usr/bin/env python
"""Generate the Long Range Arena ListOps task from its definition and check what was written.

    python run_scripts/make_listops.py --output_dir data/listops            # LRA's 96,000 / 2,000 / 2,000 rows
    python run_scripts/make_listops.py --output_dir data/listops_small --num_train 2000

Writes ``basic_train.tsv``, ``basic_val.tsv`` and ``basic_test.tsv`` (header ``Source<TAB>Target``), then reads
them back and checks every row: length in (500, 2000) tokens as LRA counts them (operators, digits and ``]``), the
label equal to the evaluated expression, no expression twice across the splits. A failed check raises an error
naming the split and row. The same ``--seed`` gives the same files. The command is
``modeling_tnn.recipes.listops.commands.make_data``.
"""

from modeling_tnn.recipes.listops.commands import make_data as main

if __name__ == "__main__":
    main()
