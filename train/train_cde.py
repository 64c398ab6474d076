"""Drop-in training script (same as the ``cde-st-train`` command).

    python train/train_cde.py --preset tiny                                  # seconds, tiny random model
    python train/train_cde.py --preset mini --output-dir runs/mini-cde       # MiniLM, 4,096 shared pairs, ~15 min CPU
    python train/train_cde.py --preset mini --set model=biencoder batching=random --output-dir runs/mini-bi
    python train/train_cde.py --config train/configs/mini_contextual.yaml --resume
    accelerate launch train/train_cde.py --preset paper                     # several GPUs

All fields: cde_st.training.TrainConfig. The logic lives in cde_st.training.
"""

from cde_st.cli import train_main

if __name__ == "__main__":
    train_main()
