"""tuitune.sim: a stand-alone SGLang emulator (``python -m tuitune.sim [SGLang flags]``).

A separate program: the core never imports it; it talks to tuitune only through its log and HTTP.
"""
