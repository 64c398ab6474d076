"""Drop-in training script (same as the ``cde-st-train`` command).

    python train/train_cde.py --preset tiny                        # tiny random model, built-in pairs, offline
    python train/train_cde.py --preset mini --set train_data=[../shared/data/pairs] --output-dir runs/mini-cde
    python train/train_cde.py --preset mini --set train_data=[../shared/data/pairs] model=biencoder batching=random
    python train/train_cde.py --config train/configs/mini_contextual.yaml --resume
    accelerate launch train/train_cde.py --preset paper --set train_data=[PATH]   # several GPUs
    python train/train_cde.py --preset mini --print-config > my.yaml              # a config to copy and edit

Presets are commented YAML files in cde_st/training/presets/ (tiny brings its own pairs; mini and paper need
train_data); train/configs/ holds this repository's configs, which name ../shared/data/pairs. Times: one measured
run per preset (the `wall_time` of each preset file, shown by --help). Without --output-dir a run writes to
runs/PRESET-MODEL-sSEED. Errors are one line (`error: ...`, exit status 2); --debug or CDE_ST_DEBUG=1 shows the
traceback. Ctrl-C or SIGTERM stops at the next step boundary, saves a checkpoint and prints the command that resumes
(exit status 130 / 143).

All fields: cde_st.training.TrainConfig. The logic lives in cde_st.training.
"""

from cde_st.cli import train_main

if __name__ == "__main__":
    train_main()
