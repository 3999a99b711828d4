    p.add_argument("--epochs", type=int, default=40, help="number of epochs to train")
    p.add_argument("--base-lr", type=float, default=None,
                   help="learning rate for a single worker (mode default: small 0.05, full 0.01)")
    p.add_argument("--wd", type=float, default=0.000005, help="weight decay (L2)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="stop when val accuracy exceeds this (mode default: small 0.82, full 0.85)")
    p.add_argument("--patience", type=int, default=2, help="epochs above the target before stopping")
    p.add_argument("--mode", choices=["auto", "small", "full"], default="auto",
                   help="small: WRN-16-1 on a subset (CPU); full: WRN-16-10 on all data; auto: full with a GPU")
    p.add_argument("--widen-factor", type=int, default=None, help="WRN widen factor (mode default: small 1, full 10)")
    p.add_argument("--train-size", type=int, default=None,
                   help="training images, 0 for all (mode default: small 6000, full all)")
    p.add_argument("--test-size", type=int, default=None,
                   help="test images, 0 for all (mode default: small 1000, full all)")
