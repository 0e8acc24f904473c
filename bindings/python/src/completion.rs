//! Awaitables completed from tokio in batches: one wake-up of the event loop for every check
//! that finished meanwhile, and no GIL on the tokio side.
//!
//! Why not `pyo3_async_runtimes::tokio::future_into_py`: it completes each future on a tokio
//! worker by taking the GIL and calling `loop.call_soon_threadsafe`, one GIL hand-off per
//! decision. With many checks in flight the workers queue on the GIL behind the event loop's
//! thread (which gives it up only every switch interval, 5 ms), and that hand-off, not the
//! store, set the throughput (docs/benchmarks.md, "Python and Node packages").
//!
//! Here a finished check is pushed, as plain Rust data, onto a queue owned by its event loop.
//! The push that makes the queue non-empty wakes the loop once: on Unix by writing one byte to
//! a socket pair whose reading end the loop watches (`loop.add_reader`), so a tokio worker
//! never takes the GIL; elsewhere by one `call_soon_threadsafe` per batch. The loop's reader
//! callback then drains the socket and the whole queue, building the Python results and
//! resolving their futures on the loop's own thread. The socket is drained before the queue is
//! taken, so a push that races with a drain always leaves a byte for the next wake-up (at
//! worst a wake-up finds the queue empty).
//!
//! The GIL is released while a check is in flight (the check is Rust code on tokio), and
//! nothing here blocks the loop: both ends of the socket are non-blocking.

use std::future::Future;
#[cfg(unix)]
use std::io::{Read, Write};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::{IntoPyObjectExt, intern};

/// Builds a finished check's Python result on the loop's thread.
type Finish = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// A finished check waiting for its loop: the asyncio future and how to build its result.
struct Done {
    future: Py<PyAny>,
    finish: Finish,
}

/// The finished checks of one event loop, and how to wake it.
struct LoopQueue {
    event_loop: Py<PyAny>,
    done: Mutex<Vec<Done>>,
    #[cfg(unix)]
    wake_tx: UnixStream,
    #[cfg(unix)]
    wake_rx: UnixStream,
    #[cfg(not(unix))]
    drain: Py<PyAny>,
}

impl LoopQueue {
    /// Queues a finished check (any thread, no GIL); wakes the loop if the queue was empty.
    fn push(&self, done: Done) {
        let first = {
            let mut queue = self.done.lock();
            queue.push(done);
            queue.len() == 1
        };
        if !first {
            return; // a wake-up is already on its way and takes everything
        }
        #[cfg(unix)]
        {
            // WouldBlock means the socket is full of earlier wake-ups: one is enough.
            let _ = (&self.wake_tx).write(&[1]);
        }
        #[cfg(not(unix))]
        Python::attach(|py| {
            let _ = self.event_loop.bind(py).call_method1(
                intern!(py, "call_soon_threadsafe"),
                (self.drain.clone_ref(py),),
            );
        });
    }

    /// Resolves every queued future (on the loop's thread, with the GIL).
    fn drain(&self, py: Python<'_>) {
        #[cfg(unix)]
        {
            let mut buf = [0u8; 64];
            while let Ok(n) = (&self.wake_rx).read(&mut buf) {
                if n < buf.len() {
                    break;
                }
            }
        }
        let batch = std::mem::take(&mut *self.done.lock());
        for Done { future, finish } in batch {
            let future = future.bind(py);
            // A cancelled await leaves its future done; its result is dropped, as asyncio does.
            match future
                .call_method0(intern!(py, "done"))
                .and_then(|d| d.is_truthy())
            {
                Ok(false) => {}
                _ => continue,
            }
            let set = match finish(py) {
                Ok(value) => future.call_method1(intern!(py, "set_result"), (value,)),
                Err(err) => future.call_method1(intern!(py, "set_exception"), (err.value(py),)),
            };
            if let Err(err) = set {
                err.write_unraisable(py, Some(future));
            }
        }
    }
}

/// The reader callback registered with the loop: drains its queue.
#[pyclass(name = "_LoopDrain", module = "sluice", frozen)]
struct LoopDrain {
    queue: Weak<LoopQueue>,
}

#[pymethods]
impl LoopDrain {
    fn __call__(&self, py: Python<'_>) {
        if let Some(queue) = self.queue.upgrade() {
            queue.drain(py);
        }
    }
}

/// The queues of the event loops that have awaited a check (rarely more than one).
static QUEUES: Mutex<Vec<Arc<LoopQueue>>> = Mutex::new(Vec::new());

/// The queue of `event_loop`, made (and its wake-up registered) on first use. Queues of closed
/// loops are dropped then.
///
/// The lock is never held while Python code runs (`is_closed`, `add_reader`, a loop's
/// finaliser): the interpreter may switch threads in the middle of it, and another thread's
/// check would then wait for the lock while holding the GIL that this one needs.
fn queue_of(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopQueue>> {
    let py = event_loop.py();
    // `is` compares pointers: no Python code runs under the lock here.
    let found = QUEUES
        .lock()
        .iter()
        .find(|q| q.event_loop.bind(py).is(event_loop))
        .cloned();
    if let Some(q) = found {
        return Ok(q);
    }
    let known: Vec<Arc<LoopQueue>> = QUEUES.lock().clone();
    let closed: Vec<Arc<LoopQueue>> = known
        .into_iter()
        .filter(|q| {
            q.event_loop
                .bind(py)
                .call_method0(intern!(py, "is_closed"))
                .and_then(|c| c.is_truthy())
                .unwrap_or(true)
        })
        .collect();
    let queue = new_queue(event_loop)?;
    {
        let mut queues = QUEUES.lock();
        queues.retain(|q| !closed.iter().any(|c| Arc::ptr_eq(c, q)));
        queues.push(Arc::clone(&queue));
    }
    drop(closed);
    Ok(queue)
}

#[cfg(unix)]
fn new_queue(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopQueue>> {
    use std::os::fd::AsRawFd;
    let py = event_loop.py();
    let (wake_tx, wake_rx) = UnixStream::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let fd = wake_rx.as_raw_fd();
    let queue = Arc::new(LoopQueue {
        event_loop: event_loop.clone().unbind(),
        done: Mutex::new(Vec::new()),
        wake_tx,
        wake_rx,
    });
    let drain = Bound::new(
        py,
        LoopDrain {
            queue: Arc::downgrade(&queue),
        },
    )?;
    event_loop.call_method1(intern!(py, "add_reader"), (fd, drain))?;
    Ok(queue)
}

#[cfg(not(unix))]
fn new_queue(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopQueue>> {
    let py = event_loop.py();
    Ok(Arc::new_cyclic(|weak| LoopQueue {
        event_loop: event_loop.clone().unbind(),
        done: Mutex::new(Vec::new()),
        drain: Py::new(
            py,
            LoopDrain {
                queue: weak.clone(),
            },
        )
        .expect("a LoopDrain is a plain object")
        .into_any(),
    }))
}

/// Runs `work` on the module's tokio runtime; returns an asyncio future of the running loop
/// that resolves to its result (or raises its error), completed in a batch with the others.
pub(crate) fn spawn<'py, F, T>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
    let queue = queue_of(&event_loop)?;
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let pending = future.clone().unbind();
    pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
        let out = work.await;
        queue.push(Done {
            future: pending,
            finish: Box::new(move |py| out.and_then(|value| value.into_py_any(py))),
        });
    });
    Ok(future)
}
