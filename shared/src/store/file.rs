//! The embedded [`Store`]: one directory on the local file system.
//!
//! Each key is a file below the root (`topics/t/0/manifest.json` is
//! `ROOT/topics/t/0/manifest.json`). Writes go to a temporary file under
//! `ROOT/.tmp/`, are flushed with `fsync`, and are renamed into place, so a reader sees
//! either the old or the new content, never a torn file.
//!
//! Conditional writes hold an exclusive `flock` on `ROOT/.lock` while they check and
//! rename, so the compare-and-swap is safe between tasks of one process and between
//! processes that share the directory (on one machine; not over NFS). Reads take no lock.
//!
//! ETags are content hashes (like S3's MD5 ETags): equal bytes give equal ETags.
//!
//! The store holds the receipt-signing key and every payload, so it is private to the
//! user running Narad: directories are created 0700 and files 0600 (on Unix), and opening
//! a store makes its root 0700 (which also closes off files an older version left 0644).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{content_etag, ETag, Failure, Listed, Object, Store, StoreError, StoreResult};

const LOCK_FILE: &str = ".lock";
const TMP_DIR: &str = ".tmp";

/// A store rooted at one directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: Arc<PathBuf>,
}

impl FileStore {
    /// Opens (creating if needed) the store at `path`.
    ///
    /// Errors: [`StoreError::Other`] when the directory cannot be created or written.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        let root = path.as_ref().to_path_buf();
        let r = root.clone();
        blocking(move || {
            create_dirs(&r.join(TMP_DIR))?;
            private(&r)?;
            private_file()
                .create(true)
                .truncate(false)
                .write(true)
                .open(r.join(LOCK_FILE))?;
            Ok(())
        })
        .await
        .map_err(|e| {
            let what = format!("cannot open file store at {}: {e}", root.display());
            StoreError::Other(Failure::caused_by(what, e))
        })?;
        Ok(Self {
            root: Arc::new(root),
        })
    }

    fn path_of(&self, key: &str) -> StoreResult<PathBuf> {
        let valid = !key.is_empty()
            && !key.starts_with('/')
            && key.split('/').all(|c| {
                !c.is_empty() && c != "." && c != ".." && !c.starts_with(".tmp") && c != LOCK_FILE
            });
        if !valid {
            return Err(StoreError::other(format!("invalid key {key:?}")));
        }
        Ok(self.root.join(key))
    }

    async fn conditional_put(&self, key: &str, data: Bytes, cond: Condition) -> StoreResult<ETag> {
        let path = self.path_of(key)?;
        let root = self.root.clone();
        blocking(move || {
            let _guard = LockGuard::acquire(&root)?;
            let current = read_opt(&path)?;
            match (&cond, current) {
                (Condition::Absent, Some(_)) => return Ok(Err(StoreError::Conflict)),
                (Condition::Absent, None) => {}
                (Condition::Match(_), None) => return Ok(Err(StoreError::NotFound)),
                (Condition::Match(want), Some(cur)) => {
                    if content_etag(&cur) != *want {
                        return Ok(Err(StoreError::Conflict));
                    }
                }
            }
            write_atomic(&root, &path, &data)?;
            Ok(Ok(content_etag(&data)))
        })
        .await
        .map_err(io_err)?
    }
}

enum Condition {
    Absent,
    Match(ETag),
}

/// Holds the store-wide exclusive lock until dropped.
struct LockGuard(File);

impl LockGuard {
    fn acquire(root: &Path) -> io::Result<Self> {
        let f = private_file()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(LOCK_FILE))?;
        f.lock()?;
        Ok(Self(f))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

fn read_opt(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::IsADirectory => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_atomic(root: &Path, path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = root.join(TMP_DIR).join(uuid::Uuid::new_v4().to_string());
    let mut f = private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_data()?;
    drop(f);
    let parent = path.parent().unwrap_or(root);
    create_dirs(parent)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Open options for a file only its owner may read or write.
fn private_file() -> OpenOptions {
    let mut o = OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

/// Creates `dir` and its missing parents, each only its owner may enter.
fn create_dirs(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// Makes `dir` private to its owner (0700).
fn private(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".tmp") || name == LOCK_FILE {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            let key: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(key.join("/"));
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("file store task failed: {e}")))?
}

/// The names of `dir`'s entries that `keep` accepts, leaving out the store's own
/// `.tmp*` and lock files; none when `dir` does not exist.
fn entries_of(
    dir: &Path,
    keep: impl Fn(&fs::DirEntry) -> io::Result<bool>,
) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let reserved = name.starts_with(".tmp") || name == LOCK_FILE;
        if !reserved && keep(&entry)? {
            names.push(name);
        }
    }
    Ok(names)
}

fn io_err(e: io::Error) -> StoreError {
    StoreError::Other(Failure::caused_by(format!("file store: {e}"), e))
}

#[async_trait]
impl Store for FileStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let path = self.path_of(key)?;
        let data = blocking(move || read_opt(&path)).await.map_err(io_err)?;
        Ok(data.map(|d| {
            let etag = content_etag(&d);
            Object {
                data: Bytes::from(d),
                etag,
            }
        }))
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.conditional_put(key, data, Condition::Absent).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.conditional_put(key, data, Condition::Match(etag.clone()))
            .await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let path = self.path_of(key)?;
        let root = self.root.clone();
        blocking(move || {
            let _guard = LockGuard::acquire(&root)?;
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
            // Tidy now-empty directories up to the root; a non-empty one stops the walk.
            let mut dir = path.parent();
            while let Some(d) = dir {
                if d == root.as_path() || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
            Ok(())
        })
        .await
        .map_err(io_err)
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        blocking(move || {
            let dir_part = match prefix.rfind('/') {
                Some(i) => &prefix[..i],
                None => "",
            };
            let start = if dir_part.is_empty() {
                root.to_path_buf()
            } else {
                root.join(dir_part)
            };
            let mut out = Vec::new();
            walk(&root, &start, &mut out)?;
            out.retain(|k| k.starts_with(&prefix));
            out.sort();
            Ok(out)
        })
        .await
        .map_err(io_err)
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let dir = self.root.join(prefix.trim_end_matches('/'));
        let after = after.to_owned();
        blocking(move || {
            // A directory whose objects were all deleted holds no key.
            let names = entries_of(
                &dir,
                |e| Ok(e.file_type()?.is_dir() && has_file(&e.path())?),
            )?;
            Ok(super::dir_page(names, &after, max))
        })
        .await
        .map_err(io_err)
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let dir = self.root.join(prefix.trim_end_matches('/'));
        let prefix = prefix.to_owned();
        blocking(move || {
            let mut names = entries_of(&dir, |e| Ok(e.file_type()?.is_file()))?;
            names.sort();
            names.truncate(super::MAX_LISTED_FILES);
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                // Deleted between the listing and the read: not listed, as on S3.
                if let Some(data) = read_opt(&dir.join(&name))? {
                    out.push(Listed {
                        key: format!("{prefix}{name}"),
                        etag: content_etag(&data),
                    });
                }
            }
            Ok(out)
        })
        .await
        .map_err(io_err)
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
}

/// Whether any file lies below `dir` (stops at the first).
fn has_file(dir: &Path) -> io::Result<bool> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() || has_file(&entry.path())? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(super::FileStore::open(dir.path()).await.unwrap());
        crate::store::testing::conformance::run_all(store, "t").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_handles_on_one_directory_share_cas() {
        // Two FileStore values on one directory behave like two processes.
        let dir = tempfile::tempdir().unwrap();
        let a = super::FileStore::open(dir.path()).await.unwrap();
        let b = super::FileStore::open(dir.path()).await.unwrap();
        use crate::store::{Store, StoreError};
        let e = a
            .put_if_absent("k", bytes::Bytes::from_static(b"1"))
            .await
            .unwrap();
        b.put_if_match("k", bytes::Bytes::from_static(b"2"), &e)
            .await
            .unwrap();
        let r = a
            .put_if_match("k", bytes::Bytes::from_static(b"3"), &e)
            .await;
        assert!(matches!(r, Err(StoreError::Conflict)));
    }

    #[tokio::test]
    async fn rejects_path_traversal() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::FileStore::open(dir.path()).await.unwrap();
        use crate::store::Store;
        assert!(s.get("../etc/passwd").await.is_err());
        assert!(s.get("/abs").await.is_err());
        assert!(s.get("a//b").await.is_err());
    }
}
