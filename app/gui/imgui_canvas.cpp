// ImGuiCanvas: Qt input and display state into ImGui, ImGui's draw lists out through OpenGL 3.3.
#include "app/gui/imgui_canvas.h"

#include <imgui.h>

#include <QClipboard>
#include <QFile>
#include <QGuiApplication>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QOpenGLContext>
#include <QWheelEvent>
#include <algorithm>
#include <cstdio>

#include "viz/qt/painter_renderer.h"

namespace kvlens::app {
namespace {

constexpr const char* kVertexShader = R"(#version 330 core
layout (location = 0) in vec2 position;
layout (location = 1) in vec2 uv;
layout (location = 2) in vec4 color;
uniform mat4 projection;
out vec2 fragment_uv;
out vec4 fragment_color;
void main() {
  fragment_uv = uv;
  fragment_color = color;
  gl_Position = projection * vec4(position, 0.0, 1.0);
}
)";

constexpr const char* kFragmentShader = R"(#version 330 core
in vec2 fragment_uv;
in vec4 fragment_color;
uniform sampler2D glyphs;
layout (location = 0) out vec4 out_color;
void main() { out_color = fragment_color * texture(glyphs, fragment_uv); }
)";

// Qt's keys as ImGui 1.86 knows them (io.KeyMap maps each ImGuiKey to itself).
int imgui_key(int qt_key) {
  switch (qt_key) {
    case Qt::Key_Tab:
      return ImGuiKey_Tab;
    case Qt::Key_Left:
      return ImGuiKey_LeftArrow;
    case Qt::Key_Right:
      return ImGuiKey_RightArrow;
    case Qt::Key_Up:
      return ImGuiKey_UpArrow;
    case Qt::Key_Down:
      return ImGuiKey_DownArrow;
    case Qt::Key_PageUp:
      return ImGuiKey_PageUp;
    case Qt::Key_PageDown:
      return ImGuiKey_PageDown;
    case Qt::Key_Home:
      return ImGuiKey_Home;
    case Qt::Key_End:
      return ImGuiKey_End;
    case Qt::Key_Insert:
      return ImGuiKey_Insert;
    case Qt::Key_Delete:
      return ImGuiKey_Delete;
    case Qt::Key_Backspace:
      return ImGuiKey_Backspace;
    case Qt::Key_Space:
      return ImGuiKey_Space;
    case Qt::Key_Return:
      return ImGuiKey_Enter;
    case Qt::Key_Escape:
      return ImGuiKey_Escape;
    case Qt::Key_Enter:
      return ImGuiKey_KeyPadEnter;
    case Qt::Key_A:
      return ImGuiKey_A;
    case Qt::Key_C:
      return ImGuiKey_C;
    case Qt::Key_V:
      return ImGuiKey_V;
    case Qt::Key_X:
      return ImGuiKey_X;
    case Qt::Key_Y:
      return ImGuiKey_Y;
    case Qt::Key_Z:
      return ImGuiKey_Z;
    default:
      return -1;
  }
}

int imgui_button(Qt::MouseButton button) {
  switch (button) {
    case Qt::LeftButton:
      return 0;
    case Qt::RightButton:
      return 1;
    case Qt::MiddleButton:
      return 2;
    default:
      return -1;
  }
}

// The font file's bytes, kept for the atlas (which is told not to own them).
const QByteArray& font_bytes() {
  static const QByteArray bytes = [] {
    viz::figure_font_family();  // registers the resource
    QFile file(":/kvlens/fonts/DejaVuSans.ttf");
    return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
  }();
  return bytes;
}

}  // namespace

ImGuiCanvas::ImGuiCanvas(QWidget* parent) : QOpenGLWidget(parent) {
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);
  setAttribute(Qt::WA_InputMethodEnabled, true);
  context_ = ImGui::CreateContext();
  ImGui::SetCurrentContext(context_);
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // window layout is ours, not a file in the working directory
  io.BackendPlatformName = "kvlens-qt";
  io.BackendRendererName = "kvlens-opengl3";
  io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset | ImGuiBackendFlags_HasMouseCursors;
  for (int key = 0; key < ImGuiKey_COUNT; ++key) io.KeyMap[key] = key;
  io.ClipboardUserData = this;
  io.SetClipboardTextFn = [](void*, const char* text) {
    QGuiApplication::clipboard()->setText(QString::fromUtf8(text));
  };
  io.GetClipboardTextFn = [](void* user) -> const char* {
    auto* self = static_cast<ImGuiCanvas*>(user);
    self->clipboard_ = QGuiApplication::clipboard()->text().toStdString();
    return self->clipboard_.c_str();
  };
  clock_.start();
  connect(&repaint_timer_, &QTimer::timeout, this, qOverload<>(&QWidget::update));
  repaint_timer_.start(16);
}

ImGuiCanvas::~ImGuiCanvas() {
  if (gl_ready_) {
    makeCurrent();
    release_textures();
    destroy_device_objects();
    doneCurrent();
  }
  ImGui::DestroyContext(context_);
}

void ImGuiCanvas::make_current_context() const {
  ImGui::SetCurrentContext(context_);
}

bool ImGuiCanvas::wants_text_input() const {
  make_current_context();
  return ImGui::GetIO().WantTextInput;
}

void ImGuiCanvas::build_fonts() {
  make_current_context();
  ImGuiIO& io = ImGui::GetIO();
  const qreal ratio = std::max<qreal>(1.0, devicePixelRatioF());
  io.Fonts->Clear();
  // Latin, general punctuation, arrows and maths: the symbols the views print (·, …, ↵, →, ×).
  static const ImWchar ranges[] = {0x0020, 0x024F, 0x2000, 0x206F, 0x2190, 0x21FF,
                                   0x2200, 0x22FF, 0x25A0, 0x25FF, 0};
  ImFontConfig config;
  config.FontDataOwnedByAtlas = false;
  config.OversampleH = 2;
  const QByteArray& bytes = font_bytes();
  if (bytes.isEmpty()) {
    ui_font_ = io.Fonts->AddFontDefault();
    figure_font_ = ui_font_;
  } else {
    void* font_data = const_cast<char*>(bytes.constData());
    ui_font_ = io.Fonts->AddFontFromMemoryTTF(font_data, int(bytes.size()), float(15.0 * ratio),
                                              &config, ranges);
    // Figure text is drawn at many sizes from one larger raster.
    figure_font_ = io.Fonts->AddFontFromMemoryTTF(font_data, int(bytes.size()), float(26.0 * ratio),
                                                  &config, ranges);
  }
  io.FontGlobalScale = float(1.0 / ratio);
  unsigned char* pixels = nullptr;
  int width = 0, height = 0;
  io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);
  if (font_texture_ == 0) glGenTextures(1, &font_texture_);
  glBindTexture(GL_TEXTURE_2D, font_texture_);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, width, height, 0, GL_RGBA, GL_UNSIGNED_BYTE, pixels);
  io.Fonts->SetTexID(reinterpret_cast<ImTextureID>(intptr_t(font_texture_)));
  io.Fonts->ClearTexData();
  font_ratio_ = ratio;
}

void ImGuiCanvas::initializeGL() {
  if (!context() || !context()->isValid()) return;  // paintGL then draws nothing
  initializeOpenGLFunctions();
  gl_ready_ = true;
  create_device_objects();
  build_fonts();
}

void ImGuiCanvas::create_device_objects() {
  auto compile = [this](GLenum kind, const char* source) {
    const GLuint shader = glCreateShader(kind);
    glShaderSource(shader, 1, &source, nullptr);
    glCompileShader(shader);
    GLint ok = 0;
    glGetShaderiv(shader, GL_COMPILE_STATUS, &ok);
    if (!ok) {
      char log[1024];
      glGetShaderInfoLog(shader, sizeof log, nullptr, log);
      std::fprintf(stderr, "kvlens: shader compile failed: %s\n", log);
    }
    return shader;
  };
  const GLuint vertex = compile(GL_VERTEX_SHADER, kVertexShader);
  const GLuint fragment = compile(GL_FRAGMENT_SHADER, kFragmentShader);
  program_ = glCreateProgram();
  glAttachShader(program_, vertex);
  glAttachShader(program_, fragment);
  glLinkProgram(program_);
  glDeleteShader(vertex);
  glDeleteShader(fragment);
  projection_location_ = glGetUniformLocation(program_, "projection");
  texture_location_ = glGetUniformLocation(program_, "glyphs");
  glGenVertexArrays(1, &vertex_array_);
  glGenBuffers(1, &vertex_buffer_);
  glGenBuffers(1, &index_buffer_);
  glBindVertexArray(vertex_array_);
  glBindBuffer(GL_ARRAY_BUFFER, vertex_buffer_);
  glBindBuffer(GL_ELEMENT_ARRAY_BUFFER, index_buffer_);
  glEnableVertexAttribArray(0);
  glEnableVertexAttribArray(1);
  glEnableVertexAttribArray(2);
  glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, pos)));
  glVertexAttribPointer(1, 2, GL_FLOAT, GL_FALSE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, uv)));
  glVertexAttribPointer(2, 4, GL_UNSIGNED_BYTE, GL_TRUE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, col)));
  glBindVertexArray(0);
}

void ImGuiCanvas::destroy_device_objects() {
  if (!program_) return;
  glDeleteProgram(program_);
  glDeleteBuffers(1, &vertex_buffer_);
  glDeleteBuffers(1, &index_buffer_);
  glDeleteVertexArrays(1, &vertex_array_);
  if (font_texture_) glDeleteTextures(1, &font_texture_);
  program_ = vertex_buffer_ = index_buffer_ = vertex_array_ = font_texture_ = 0;
}

void* ImGuiCanvas::make_texture(const uint8_t* rgba, int width, int height) {
  GLuint texture = 0;
  glGenTextures(1, &texture);
  glBindTexture(GL_TEXTURE_2D, texture);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, width, height, 0, GL_RGBA, GL_UNSIGNED_BYTE, rgba);
  textures_.push_back(texture);
  return reinterpret_cast<void*>(intptr_t(texture));
}

void ImGuiCanvas::release_textures() {
  if (!textures_.empty()) glDeleteTextures(GLsizei(textures_.size()), textures_.data());
  textures_.clear();
}

void ImGuiCanvas::resizeGL(int, int) {}

void ImGuiCanvas::paintGL() {
  if (!gl_ready_) return;
  make_current_context();
  if (devicePixelRatioF() != font_ratio_) build_fonts();
  ImGuiIO& io = ImGui::GetIO();
  const qreal ratio = devicePixelRatioF();
  io.DisplaySize = ImVec2(float(width()), float(height()));
  io.DisplayFramebufferScale = ImVec2(float(ratio), float(ratio));
  const double now = double(clock_.nsecsElapsed()) * 1e-9;
  io.DeltaTime = float(std::max(1e-4, now - last_frame_seconds_));
  last_frame_seconds_ = now;
  ImGui::NewFrame();
  if (frame_) frame_();
  ImGui::Render();
  render_draw_data(ImGui::GetDrawData());
  switch (ImGui::GetMouseCursor()) {
    case ImGuiMouseCursor_TextInput:
      setCursor(Qt::IBeamCursor);
      break;
    case ImGuiMouseCursor_Hand:
      setCursor(Qt::PointingHandCursor);
      break;
    case ImGuiMouseCursor_ResizeEW:
      setCursor(Qt::SizeHorCursor);
      break;
    case ImGuiMouseCursor_ResizeNS:
      setCursor(Qt::SizeVerCursor);
      break;
    default:
      setCursor(Qt::ArrowCursor);
      break;
  }
  ++frames_;
  ++fps_window_frames_;
  if (now - fps_window_start_ >= 1.0) {
    fps_ = double(fps_window_frames_) / (now - fps_window_start_);
    fps_window_start_ = now;
    fps_window_frames_ = 0;
  }
}

void ImGuiCanvas::render_draw_data(ImDrawData* draw) {
  const int fb_width = int(draw->DisplaySize.x * draw->FramebufferScale.x);
  const int fb_height = int(draw->DisplaySize.y * draw->FramebufferScale.y);
  if (fb_width <= 0 || fb_height <= 0) return;
  glViewport(0, 0, fb_width, fb_height);
  const ImVec4 background = ImGui::GetStyle().Colors[ImGuiCol_WindowBg];
  glClearColor(background.x, background.y, background.z, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  glEnable(GL_BLEND);
  glBlendEquation(GL_FUNC_ADD);
  glBlendFuncSeparate(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA, GL_ONE, GL_ONE_MINUS_SRC_ALPHA);
  glDisable(GL_CULL_FACE);
  glDisable(GL_DEPTH_TEST);
  glEnable(GL_SCISSOR_TEST);
  const float left = draw->DisplayPos.x, right = left + draw->DisplaySize.x;
  const float top = draw->DisplayPos.y, bottom = top + draw->DisplaySize.y;
  const float projection[16] = {2.0f / (right - left),
                                0,
                                0,
                                0,
                                0,
                                2.0f / (top - bottom),
                                0,
                                0,
                                0,
                                0,
                                -1.0f,
                                0,
                                (right + left) / (left - right),
                                (top + bottom) / (bottom - top),
                                0,
                                1.0f};
  glUseProgram(program_);
  glUniform1i(texture_location_, 0);
  glUniformMatrix4fv(projection_location_, 1, GL_FALSE, projection);
  glBindVertexArray(vertex_array_);
  glActiveTexture(GL_TEXTURE0);
  const ImVec2 clip_offset = draw->DisplayPos, clip_scale = draw->FramebufferScale;
  for (int n = 0; n < draw->CmdListsCount; ++n) {
    const ImDrawList* list = draw->CmdLists[n];
    glBindBuffer(GL_ARRAY_BUFFER, vertex_buffer_);
    glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(list->VtxBuffer.Size) * sizeof(ImDrawVert),
                 list->VtxBuffer.Data, GL_STREAM_DRAW);
    glBindBuffer(GL_ELEMENT_ARRAY_BUFFER, index_buffer_);
    glBufferData(GL_ELEMENT_ARRAY_BUFFER, GLsizeiptr(list->IdxBuffer.Size) * sizeof(ImDrawIdx),
                 list->IdxBuffer.Data, GL_STREAM_DRAW);
    for (int c = 0; c < list->CmdBuffer.Size; ++c) {
      const ImDrawCmd& cmd = list->CmdBuffer[c];
      if (cmd.UserCallback) {
        if (cmd.UserCallback != ImDrawCallback_ResetRenderState) cmd.UserCallback(list, &cmd);
        continue;
      }
      const float x0 = (cmd.ClipRect.x - clip_offset.x) * clip_scale.x;
      const float y0 = (cmd.ClipRect.y - clip_offset.y) * clip_scale.y;
      const float x1 = (cmd.ClipRect.z - clip_offset.x) * clip_scale.x;
      const float y1 = (cmd.ClipRect.w - clip_offset.y) * clip_scale.y;
      if (x1 <= x0 || y1 <= y0) continue;
      glScissor(int(x0), int(float(fb_height) - y1), int(x1 - x0), int(y1 - y0));
      glBindTexture(GL_TEXTURE_2D, GLuint(intptr_t(cmd.GetTexID())));
      glDrawElementsBaseVertex(GL_TRIANGLES, GLsizei(cmd.ElemCount),
                               sizeof(ImDrawIdx) == 2 ? GL_UNSIGNED_SHORT : GL_UNSIGNED_INT,
                               reinterpret_cast<void*>(intptr_t(cmd.IdxOffset * sizeof(ImDrawIdx))),
                               GLint(cmd.VtxOffset));
    }
  }
  glBindVertexArray(0);
  glDisable(GL_SCISSOR_TEST);
}

void ImGuiCanvas::mouse_button(QMouseEvent* event, bool down) {
  make_current_context();
  const int button = imgui_button(event->button());
  if (button >= 0) ImGui::GetIO().MouseDown[button] = down;
  update();
}

void ImGuiCanvas::mousePressEvent(QMouseEvent* event) {
  mouse_button(event, true);
}

void ImGuiCanvas::mouseReleaseEvent(QMouseEvent* event) {
  mouse_button(event, false);
}

void ImGuiCanvas::mouseMoveEvent(QMouseEvent* event) {
  make_current_context();
  ImGui::GetIO().MousePos = ImVec2(float(event->position().x()), float(event->position().y()));
}

void ImGuiCanvas::wheelEvent(QWheelEvent* event) {
  make_current_context();
  ImGuiIO& io = ImGui::GetIO();
  io.MouseWheel += float(event->angleDelta().y()) / 120.0f;
  io.MouseWheelH += float(event->angleDelta().x()) / 120.0f;
  event->accept();
}

void ImGuiCanvas::key_event(QKeyEvent* event, bool down) {
  make_current_context();
  ImGuiIO& io = ImGui::GetIO();
  const Qt::KeyboardModifiers modifiers = event->modifiers();
  io.KeyCtrl = modifiers & Qt::ControlModifier;
  io.KeyShift = modifiers & Qt::ShiftModifier;
  io.KeyAlt = modifiers & Qt::AltModifier;
  io.KeySuper = modifiers & Qt::MetaModifier;
  const int key = imgui_key(event->key());
  if (key >= 0) io.KeysDown[key] = down;
  if (down && !io.KeyCtrl && !io.KeyAlt && !event->text().isEmpty() && event->text()[0].isPrint())
    io.AddInputCharactersUTF8(event->text().toUtf8().constData());
}

void ImGuiCanvas::keyPressEvent(QKeyEvent* event) {
  key_event(event, true);
  if (!ImGui::GetIO().WantTextInput) emit unhandled_key(event->key(), event->modifiers());
  update();
}

void ImGuiCanvas::keyReleaseEvent(QKeyEvent* event) {
  key_event(event, false);
}

void ImGuiCanvas::focusInEvent(QFocusEvent* event) {
  make_current_context();
  ImGui::GetIO().AddFocusEvent(true);
  QOpenGLWidget::focusInEvent(event);
}

void ImGuiCanvas::focusOutEvent(QFocusEvent* event) {
  make_current_context();
  ImGui::GetIO().AddFocusEvent(false);
  QOpenGLWidget::focusOutEvent(event);
}

bool ImGuiCanvas::event(QEvent* event) {
  if (event->type() == QEvent::Leave) {
    make_current_context();
    ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
  }
  return QOpenGLWidget::event(event);
}

}  // namespace kvlens::app
