"""Drop-in training script (same as the ``cde-st-train`` command).

    python train/train_cde.py --preset tiny                                  # tiny random model: ~40 s
    python train/train_cde.py --preset mini --output-dir runs/mini-cde       # MiniLM, 4,096 shared pairs: ~13 min
    python train/train_cde.py --preset mini --set model=biencoder batching=random --output-dir runs/mini-bi
    python train/train_cde.py --config train/configs/mini_contextual.yaml --resume
    accelerate launch train/train_cde.py --preset paper                     # several GPUs

Times: one measured run per preset on the project's shared 2-core CPU (cde_st.training.PRESET_TIMES, shown by
--help). Without --output-dir a run writes to runs/PRESET-MODEL-sSEED. Errors are one line (`error: ...`, exit
status 2); --debug or CDE_ST_DEBUG=1 shows the traceback.

All fields: cde_st.training.TrainConfig. The logic lives in cde_st.training.
"""

from cde_st.cli import train_main

if __name__ == "__main__":
    train_main()
