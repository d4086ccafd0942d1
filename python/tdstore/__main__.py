"""python3 -m tdstore import|export: the importers of tdstore.importers from the command line,
for the formats the torch-free `tdstore` tool does not read (HDF5, zarr) and all the others.

    python3 -m tdstore import STORE SOURCE [--format F] [--append] [--compress zstd[:LEVEL]]
                              [--chunk-mib N] [--no-progress]
    python3 -m tdstore export STORE DIR [--format tensordict|npy] [KEY ...]

Errors are printed as one line "tdstore: <message>" (exit status 1), never a traceback.
"""
import argparse
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m tdstore", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="a tensordict memmap dir, HDF5 file, zarr group or .npy files into a store")
    imp.add_argument("store")
    imp.add_argument("source")
    imp.add_argument("--format", choices=["tensordict", "hdf5", "zarr", "npy"], default=None)
    imp.add_argument("--append", action="store_true", help="append the rows to the store's keys")
    imp.add_argument("--compress", default=None, metavar="zstd[:LEVEL]", help="compression of new keys")
    imp.add_argument("--chunk-mib", type=int, default=64, help="rows copied per commit, in MiB")
    imp.add_argument("--no-progress", action="store_true", help="no progress bar")
    exp = sub.add_parser("export", help="a store to a tensordict memmap directory or .npy files")
    exp.add_argument("store")
    exp.add_argument("dir")
    exp.add_argument("keys", nargs="*")
    exp.add_argument("--format", choices=["tensordict", "npy"], default="tensordict")
    args = p.parse_args(argv)

    import tdstore
    try:
        if args.command == "import":
            r = tdstore.import_from(args.source, args.store, format=args.format, append=args.append,
                                    compression=args.compress, chunk_bytes=max(1, args.chunk_mib) << 20,
                                    progress=not args.no_progress)
            if r.resumed_from:
                print(f"{args.store}: {'already holds all' if r.rows == 0 else 'resumed after'} "
                      f"{r.resumed_from} rows an earlier import committed")
            print(f"{args.store}: imported {r.keys} key(s), {r.rows} rows; now {r.total_rows} rows, "
                  f"generation {r.generation}; {r.verified_bytes} bytes verified")
        else:
            keys = tdstore.export_to(args.store, args.dir, format=args.format, keys=args.keys or None)
            print(f"{args.store}: wrote {len(keys)} key(s) to {args.dir} ({args.format})")
    except tdstore.Error as e:
        print(f"tdstore: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
