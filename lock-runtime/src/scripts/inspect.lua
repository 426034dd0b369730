-- inspect: what the backend records of one lock, read-only.
--
-- KEYS[1]  the lock hash          (holder id -> hold count, 'fence' -> token)
-- KEYS[2]  the fair queue         (list of holder ids, oldest first)
--
-- returns  {fields, pttl, queue}: the hash's fields and values as a flat
--          list (empty when the lock is free), its remaining lease in ms
--          (-2 when there is none), and the queued holder ids.
return {
  redis.call('hgetall', KEYS[1]),
  redis.call('pttl', KEYS[1]),
  redis.call('lrange', KEYS[2], 0, -1),
}
