//! Makes PyO3's configuration flags (`Py_GIL_DISABLED` for a free-threaded interpreter)
//! available to this crate's code, as PyO3's guide prescribes.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
