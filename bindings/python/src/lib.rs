use pyo3::prelude::*;
#[pymodule]
fn _sluice(_m: &Bound<'_, PyModule>) -> PyResult<()> { Ok(()) }
