"""Scripts that run on the target, standard library only (torch for the NCCL worker): they are sent
as ``python -c`` or uploaded, never imported by tuitune."""
